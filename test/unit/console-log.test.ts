/**
 * The console log hostd writes for each VM (vm/qemu/console-log.ts): never over its cap, however much
 * comes and in whatever pieces, its last lines kept; it goes on after what an earlier hostd left,
 * and never writes through a link that QEMU's account could plant.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { ConsoleLog, KEEP_BYTES } from '../../src/vm/qemu/console-log.js';

const KiB = 1024;

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'hostd-console-log-'));
  try {
    await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A stand-in for QEMU's console socket: what is written into it is what the guest printed. */
const fakeSocket = (): PassThrough & Socket => new PassThrough() as PassThrough & Socket;

test('a flood never takes the file over its cap, and the last lines stay', async () => {
  await withDir(async (dir) => {
    const path = join(dir, 'console.log');
    const cap = 256 * KiB;
    const log = await ConsoleLog.open(path, cap);
    const socket = fakeSocket();
    log.attach(socket);
    let largest = 0;
    for (let i = 0; i < 4000; i++) {
      socket.write(`line ${i} ${'x'.repeat(i % 300)}\n`);
      if (i % 50 === 0) {
        await log.flushed();
        largest = Math.max(largest, (await stat(path)).size);
      }
    }
    socket.end('the last line\n'); // QEMU exits
    await log.flushed(true);
    const text = await readFile(path, 'utf8');
    assert.ok(Math.max(largest, text.length) <= cap, `${largest} bytes`);
    assert.ok(text.length >= KEEP_BYTES, 'the tail kept when the cap was reached');
    assert.ok(text.endsWith('line 3999 ' + 'x'.repeat(3999 % 300) + '\nthe last line\n'));
    await log.close();
  });
});

test('a piece larger than the cap keeps its end', async () => {
  await withDir(async (dir) => {
    const path = join(dir, 'console.log');
    const log = await ConsoleLog.open(path, 128 * KiB);
    const socket = fakeSocket();
    log.attach(socket);
    socket.end(Buffer.concat([Buffer.alloc(300 * KiB, 'a'), Buffer.from('END\n')]));
    await log.flushed(true);
    await log.close();
    const text = await readFile(path, 'utf8');
    assert.ok(text.length <= 128 * KiB);
    assert.ok(text.endsWith('aEND\n'));
  });
});

test('it goes on after what was there, and brings an oversized file under the cap', async () => {
  await withDir(async (dir) => {
    const path = join(dir, 'console.log');
    await writeFile(path, 'earlier boot\n');
    const kept = await ConsoleLog.open(path, 128 * KiB);
    const socket = fakeSocket();
    kept.attach(socket);
    socket.end('after the restart\n');
    await kept.flushed(true);
    await kept.close();
    assert.equal(await readFile(path, 'utf8'), 'earlier boot\nafter the restart\n');

    await writeFile(path, 'y'.repeat(512 * KiB)); // what a QEMU writing the file itself left
    const rotated = await ConsoleLog.open(path, 128 * KiB);
    const again = fakeSocket();
    rotated.attach(again);
    again.end('new\n');
    await rotated.flushed(true);
    await rotated.close();
    const text = await readFile(path, 'utf8');
    assert.equal(text.length, KEEP_BYTES + 4);
    assert.ok(text.endsWith('yyynew\n'));
  });
});

test('a link at its path is refused: hostd never writes where QEMU points it', async () => {
  await withDir(async (dir) => {
    await writeFile(join(dir, 'precious'), 'keep me');
    await symlink(join(dir, 'precious'), join(dir, 'console.log'));
    await assert.rejects(ConsoleLog.open(join(dir, 'console.log')));
    assert.equal(await readFile(join(dir, 'precious'), 'utf8'), 'keep me');
  });
});
