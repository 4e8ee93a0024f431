/**
 * The tar pieces on their own: what the writer produces reads back the same, and extraction
 * of an archive from a sandbox (untrusted code) never writes outside its directory or through
 * a symlink, strips setuid bits, skips FIFOs, and refuses bytes that are not a tar stream.
 */
import assert from 'node:assert/strict';
import { lstat, mkdir, mkdtemp, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { HostdError, UnsafeArchiveError } from '../src/index.js';
import { extractTar } from '../src/tar-extract.js';
import { readTar } from '../src/tar-read.js';
import { TRAILER, headerBlocks, padding, tarDirectory } from '../src/tar-write.js';
import { craftTar, type Member } from './helpers/crafted-tar.js';
import { awkwardTree, makeTree, readTree } from './helpers/tree.js';

let work: string;
before(async () => {
  work = await mkdtemp(join(tmpdir(), 'hostd-sdk-tar-'));
});
after(() => rm(work, { recursive: true, force: true }));

let n = 0;
/** A fresh directory to extract into, inside a parent that holds an `outside` file. */
async function target(): Promise<{ dest: string; outside: string }> {
  const parent = join(work, `case-${n++}`);
  await mkdir(parent);
  const outside = join(parent, 'outside.txt');
  await writeFile(outside, 'untouched\n');
  return { dest: join(parent, 'dest'), outside };
}

function extract(tar: Buffer, dest: string): Promise<unknown> {
  return extractTar(Readable.from([tar]), dest);
}

describe('tar writer and reader', () => {
  test('a directory written and read back is the same tree', async () => {
    const src = join(work, 'roundtrip-src');
    await makeTree(src, awkwardTree());
    const out = join(work, 'roundtrip-out');
    await extractTar(Readable.from(tarDirectory(src)), out);
    assert.deepEqual(await readTree(out), await readTree(src));
  });

  test('long names and link targets go in PAX records that the reader applies', async () => {
    const path = `${'p'.repeat(150)}/ñ.txt`;
    const linkpath = `${'t'.repeat(120)}`;
    const tar = Buffer.concat([
      headerBlocks({ path, type: 'file', size: 2, mode: 0o640, mtimeMs: 1_700_000_000_000 }),
      Buffer.from('ok'),
      padding(2),
      headerBlocks({ path: 'l', type: 'symlink', size: 0, mode: 0o777, mtimeMs: 0, linkpath }),
      TRAILER,
    ]);
    const entries = [];
    for await (const e of readTar(Readable.from([tar]))) {
      const chunks: Buffer[] = [];
      for await (const c of e.body) chunks.push(c);
      entries.push({ ...e, body: Buffer.concat(chunks).toString() });
    }
    assert.deepEqual(
      entries.map((e) => [e.path, e.type, e.size, e.mode, e.mtimeMs, e.linkpath, e.body]),
      [
        [path, 'file', 2, 0o640, 1_700_000_000_000, '', 'ok'],
        ['l', 'symlink', 0, 0o777, 0, linkpath, ''],
      ],
    );
  });

  test('bytes that are not a tar stream are a HostdError', async () => {
    const { dest } = await target();
    await assert.rejects(extract(Buffer.alloc(1024, 'x'), dest), HostdError);
    await assert.rejects(extract(Buffer.alloc(700, 0).fill(1, 0, 1), dest), HostdError);
  });
});

describe('extracting an untrusted archive', () => {
  const refused: Array<[string, Member[]]> = [
    ['a path with ..', [{ name: '../outside.txt', type: 'file', data: 'pwned\n' }]],
    ['a nested path with ..', [{ name: 'a/../../outside.txt', type: 'file', data: 'pwned\n' }]],
    ['an absolute path', [{ name: '/tmp/hostd-sdk-evil', type: 'file', data: 'pwned\n' }]],
    [
      'a file through a symlink to outside',
      [
        { name: 'link', type: 'symlink', linkname: '..' },
        { name: 'link/outside.txt', type: 'file', data: 'pwned\n' },
      ],
    ],
    ['a hard link to outside', [{ name: 'h', type: 'hardlink', linkname: '../outside.txt' }]],
    [
      'a hard link through a symlink',
      [
        { name: 'link', type: 'symlink', linkname: '../outside.txt' },
        { name: 'h', type: 'hardlink', linkname: 'link' },
      ],
    ],
  ];
  for (const [what, members] of refused) {
    test(`refuses ${what}, leaving what is outside untouched`, async () => {
      const { dest, outside } = await target();
      await assert.rejects(extract(craftTar(members), dest), UnsafeArchiveError);
      assert.equal(await readFile(outside, 'utf8'), 'untouched\n');
      await assert.rejects(lstat('/tmp/hostd-sdk-evil'), { code: 'ENOENT' });
    });
  }

  test('a file over an existing symlink replaces the link instead of writing through it', async () => {
    const { dest, outside } = await target();
    await extract(
      craftTar([
        { name: 'x', type: 'symlink', linkname: '../outside.txt' },
        { name: 'x', type: 'file', data: 'inside\n' },
      ]),
      dest,
    );
    assert.equal(await readFile(outside, 'utf8'), 'untouched\n');
    assert.ok((await lstat(join(dest, 'x'))).isFile());
    assert.equal(await readFile(join(dest, 'x'), 'utf8'), 'inside\n');
  });

  test('symlinks are recreated as they are; setuid bits go; FIFOs are skipped', async () => {
    const { dest } = await target();
    await extract(
      craftTar([
        { name: 'abs', type: 'symlink', linkname: '/etc/hostname' },
        { name: 'suid', type: 'file', data: '#!/bin/sh\n', mode: 0o4755 },
        { name: 'pipe', type: 'fifo' },
      ]),
      dest,
    );
    assert.equal(await readlink(join(dest, 'abs')), '/etc/hostname');
    assert.equal((await lstat(join(dest, 'suid'))).mode & 0o7777, 0o755);
    await assert.rejects(lstat(join(dest, 'pipe')), { code: 'ENOENT' });
  });

  test('a read-only directory still receives its contents', async () => {
    const { dest } = await target();
    await extract(
      craftTar([
        { name: 'ro', type: 'dir', mode: 0o555 },
        { name: 'ro/f', type: 'file', data: 'x' },
      ]),
      dest,
    );
    assert.equal(await readFile(join(dest, 'ro', 'f'), 'utf8'), 'x');
    assert.equal((await lstat(join(dest, 'ro'))).mode & 0o777, 0o755, 'owner keeps rwx');
  });
});
