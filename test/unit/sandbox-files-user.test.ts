/**
 * File operations as a user (core/sandbox-files.ts, guest/PROTOCOL.md "As a user"), against the
 * fake hypervisor: they take the file lane as every file operation, resolve relative paths in
 * the guest, and turn the guest's refusals into registry errors.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { isError } from '../../src/errors.js';
import { started } from '../helpers/manager.js';

const never = new AbortController().signal;
const body = (text: string): Readable => Readable.from([Buffer.from(text)]);

describe('files as a user', () => {
  test("a relative path is the user's home's, and the write says where it went", async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    const done = await manager.files.writeAs(id, 'user', 'notes.txt', body('hi'), never);
    assert.deepEqual(done, { path: '/home/user/notes.txt', size: 2 });
    const entry = await manager.files.statAs(id, 'user', '~/notes.txt', never);
    assert.equal(entry.path, '/home/user/notes.txt');
    assert.equal(entry.owner, 'user');
  });

  test('metadata given with a write comes back in its answer', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    const done = await manager.files.writeAs(id, 'user', '/tmp/m', body('x'), never, { k: 'v' });
    assert.deepEqual(done.metadata, { k: 'v' });
  });

  test('mkdir says whether it made the directory; remove whether there was anything', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    assert.equal((await manager.files.mkdirAs(id, 'user', 'd', never)).created, true);
    assert.equal((await manager.files.mkdirAs(id, 'user', 'd', never)).created, false);
    assert.equal(await manager.files.removeAs(id, 'user', 'd', never), true);
    assert.equal(await manager.files.removeAs(id, 'user', 'd', never), false);
  });

  test('a listing walks as deep as asked', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    await manager.files.writeAs(id, 'root', '/w/a', body('1'), never);
    await manager.files.writeAs(id, 'root', '/w/sub/b', body('2'), never);
    const names = async (depth: number): Promise<string[]> =>
      (await manager.files.listAs(id, 'root', '/w', depth, never)).map((e) => e.path);
    assert.deepEqual(await names(1), ['/w/a']);
    assert.deepEqual(await names(2), ['/w/a', '/w/sub/b']);
  });

  test('move renames and answers the new entry', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    await manager.files.writeAs(id, 'root', '/a', body('x'), never);
    const moved = await manager.files.move(id, '/a', '/b', never);
    assert.equal(moved.entry.path, '/b');
    await assert.rejects(manager.files.statAs(id, 'root', '/a', never), (err: unknown) =>
      isError(err, 'fileNotFound'),
    );
  });

  test('an unknown user is unknown_user, naming it', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    await assert.rejects(
      manager.files.statAs(id, 'mallory', 'x', never),
      (err: unknown) => isError(err, 'unknownUser') && err.message.includes("'mallory'"),
    );
  });
});
