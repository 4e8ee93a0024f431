/**
 * `sandbox.files` against a fake: the exact requests of docs/api.md ("Files") for every method,
 * uploads of text, bytes and streams (chunked, never held whole), streamed downloads, and
 * directories both ways as tar streams that GNU tar reads and writes.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { ReadableStream } from 'node:stream/web';
import { after, before, beforeEach, describe, test } from 'node:test';
import {
  ConnectionError,
  InvalidRequestError,
  Sandbox,
  SandboxFileNotFoundError,
  type EntryInfo,
} from '../src/index.js';
import {
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type Handler,
} from './helpers/fake-hostd.js';
import { awkwardTree, makeTree, readTree } from './helpers/tree.js';

const ID = 'sbx_' + '9'.repeat(32);
const FILES = `/v1/sandboxes/${ID}/files`;
const ENTRY: EntryInfo = {
  name: 'a b.txt',
  path: '/root/a b.txt',
  type: 'file',
  size: 5,
  mode: 420,
  mtime_ms: 1763640000123,
};

function ok(res: ServerResponse, body: unknown): void {
  sendJson(res, 200, body);
}

describe('files', { timeout: 60_000 }, () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  let work: string;
  let from = 0;
  before(async () => {
    fake = await startFakeHostd((_req, res) => ok(res, { id: ID, state: 'ready' }));
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url });
    work = await mkdtemp(join(tmpdir(), 'hostd-sdk-files-'));
  });
  beforeEach(() => {
    from = fake.requests.length;
  });
  after(async () => {
    await fake.close();
    await rm(work, { recursive: true, force: true });
  });

  const last = (): (typeof fake.requests)[number] => fake.requests.at(-1)!;

  test('write sends the bytes to PUT files?path=, with mode as an octal string', async () => {
    fake.handle((req, res) => ok(res, { path: '/root/a b.txt', size: req.bytes.length }));
    assert.deepEqual(await sandbox.files.write('/root/a b.txt', 'héllo'), {
      path: '/root/a b.txt',
      size: 6,
    });
    assert.equal(last().method, 'PUT');
    assert.equal(last().url, `${FILES}?path=%2Froot%2Fa%20b.txt`);
    assert.equal(last().headers['content-type'], 'application/octet-stream');
    assert.equal(last().headers['content-length'], '6');
    assert.equal(last().body, 'héllo');
    await sandbox.files.write('/x', new Uint8Array([0, 255]), { mode: 0o755 });
    assert.equal(last().url, `${FILES}?path=%2Fx&mode=0755`);
    assert.deepEqual([...last().bytes], [0, 255]);
    await sandbox.files.write('/x', new Uint8Array([1]).buffer, { mode: '0600' });
    assert.equal(last().url, `${FILES}?path=%2Fx&mode=0600`);
    assert.deepEqual([...last().bytes], [1]);
  });

  test('write streams a Node stream, a web stream and an async iterable, chunked', async () => {
    fake.handle((req, res) => ok(res, { path: '/s', size: req.bytes.length }));
    const chunks = ['one ', 'two ', 'three'];
    async function* gen(): AsyncGenerator<Uint8Array> {
      for (const c of chunks) yield Buffer.from(c);
    }
    const sources = [
      Readable.from(chunks.map((c) => Buffer.from(c))),
      ReadableStream.from(gen()),
      gen(),
    ];
    for (const source of sources) {
      assert.deepEqual(await sandbox.files.write('/s', source), { path: '/s', size: 13 });
      assert.equal(last().body, 'one two three');
      assert.equal(last().headers['transfer-encoding'], 'chunked');
      assert.equal(last().headers['content-length'], undefined);
    }
  });

  test('a source stream that fails rejects with its own error, not a connection error', async () => {
    fake.handle((req, res) => ok(res, { path: '/s', size: req.bytes.length }));
    const failing = new Readable({
      read() {
        this.destroy(Object.assign(new Error('disk on fire'), { code: 'EIO' }));
      },
    });
    await assert.rejects(sandbox.files.write('/s', failing), (e: unknown) => {
      assert.equal((e as NodeJS.ErrnoException).code, 'EIO');
      assert.equal(e instanceof ConnectionError, false);
      return true;
    });
  });

  test('read returns the bytes; a missing file is SandboxFileNotFoundError', async () => {
    fake.handle((req, res) => {
      if (req.url.includes('missing')) {
        return sendError(res, 404, '/missing does not exist', 'file_not_found');
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '3' });
      res.end(Buffer.from([1, 2, 3]));
    });
    assert.deepEqual([...(await sandbox.files.read('/root/f.bin'))], [1, 2, 3]);
    assert.equal(last().method, 'GET');
    assert.equal(last().url, `${FILES}?path=%2Froot%2Ff.bin`);
    assert.equal(last().headers.accept, 'application/octet-stream');
    await assert.rejects(sandbox.files.read('/missing'), (e: unknown) => {
      assert.ok(e instanceof SandboxFileNotFoundError);
      assert.equal(e.code, 'file_not_found');
      return true;
    });
  });

  test('readStream yields the body as it arrives; a cut-off body is ConnectionError', async () => {
    const big = Buffer.alloc(1 << 20, 7);
    fake.handle((_req, res) => {
      res.writeHead(200, { 'content-length': String(big.length) });
      res.end(big);
    });
    const chunks: Buffer[] = [];
    for await (const c of await sandbox.files.readStream('/big')) chunks.push(c as Buffer);
    assert.ok(Buffer.concat(chunks).equals(big));
    assert.ok(chunks.length > 1, 'it streamed');

    fake.handle((_req, res) => {
      res.writeHead(200, { 'content-length': '100' });
      res.write(Buffer.alloc(10));
      setImmediate(() => res.destroy());
    });
    await assert.rejects(async () => {
      for await (const c of await sandbox.files.readStream('/cut')) assert.ok(c);
    }, ConnectionError);
  });

  test('list, stat, mkdir and remove use the routes and parameters of docs/api.md', async () => {
    fake.handle((req, res) => {
      if (req.url.startsWith(`${FILES}/list`)) return ok(res, { entries: [ENTRY] });
      if (req.url.startsWith(`${FILES}/stat`)) return ok(res, ENTRY);
      if (req.url.startsWith(`${FILES}/mkdir`)) return ok(res, { path: '/root/d' });
      if (req.url.startsWith(`${FILES}/move`)) return ok(res, { path: '/root/new name' });
      if (req.url.endsWith('%2Froot%2Ffile')) {
        return sendError(res, 400, '/root/file is a directory', 'is_a_directory');
      }
      res.writeHead(204);
      res.end();
    });
    assert.deepEqual(await sandbox.files.list('/root'), [ENTRY]);
    assert.deepEqual(await sandbox.files.stat('/root/a b.txt'), ENTRY);
    await sandbox.files.mkdir('/root/d');
    assert.equal(await sandbox.files.move('/root/d', '/root/new name'), '/root/new name');
    await sandbox.files.remove('/root/d', { recursive: true });
    await sandbox.files.remove('/root/e');
    await assert.rejects(sandbox.files.remove('/root/file'), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.code, 'is_a_directory');
      return true;
    });
    assert.deepEqual(
      fake.requests.slice(from).map((r) => [r.method, r.url, r.body]),
      [
        ['GET', `${FILES}/list?path=%2Froot`, ''],
        ['GET', `${FILES}/stat?path=%2Froot%2Fa%20b.txt`, ''],
        ['POST', `${FILES}/mkdir?path=%2Froot%2Fd`, ''],
        ['POST', `${FILES}/move?path=%2Froot%2Fd&to=%2Froot%2Fnew%20name`, ''],
        ['DELETE', `${FILES}?path=%2Froot%2Fd&recursive=1`, ''],
        ['DELETE', `${FILES}?path=%2Froot%2Fe`, ''],
        ['DELETE', `${FILES}?path=%2Froot%2Ffile`, ''],
      ],
    );
  });

  test('uploadDir sends one tar stream that GNU tar unpacks into the same tree', async () => {
    const src = join(work, 'up-src');
    await makeTree(src, awkwardTree());
    fake.handle((req, res) => ok(res, { path: '/root/up', files: 6, size: req.bytes.length }));
    const info = await sandbox.files.uploadDir(src, '/root/up');
    assert.deepEqual(info, { path: '/root/up', files: 6, size: last().bytes.length });
    assert.equal(last().method, 'PUT');
    assert.equal(last().url, `${FILES}?path=%2Froot%2Fup`);
    assert.equal(last().headers['content-type'], 'application/x-tar');
    const out = join(work, 'up-out');
    await makeTree(out, {});
    const tar = spawnSync('tar', ['-x', '-C', out], { input: last().bytes });
    assert.equal(tar.status, 0, tar.stderr.toString());
    assert.deepEqual(await readTree(out), await readTree(src));
  });

  for (const format of ['gnu', 'pax', 'ustar'] as const) {
    test(`downloadDir unpacks GNU tar's ${format} format into the same tree`, async () => {
      const tree =
        format === 'ustar'
          ? { 'a.txt': awkwardTree()['a.txt']!, 'sub/b': awkwardTree()['run.sh']! }
          : awkwardTree();
      const src = join(work, `down-src-${format}`);
      await makeTree(src, tree);
      const tar = spawnSync('tar', ['-c', `--format=${format}`, '-C', src, '.']);
      assert.equal(tar.status, 0, tar.stderr.toString());
      fake.handle((_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-tar' });
        res.end(tar.stdout);
      });
      const out = join(work, `down-out-${format}`);
      const info = await sandbox.files.downloadDir('/root/data', out);
      assert.equal(last().url, `${FILES}?path=%2Froot%2Fdata&format=tar`);
      assert.equal(last().headers.accept, 'application/x-tar');
      assert.deepEqual(await readTree(out), await readTree(src));
      const files = Object.values(tree).filter((n) => n.type === 'file');
      assert.deepEqual(info, {
        path: out,
        files: files.length,
        size: files.reduce((sum, n) => sum + Buffer.byteLength(n.content), 0),
      });
    });
  }

  test('downloadDir of a hard link makes a hard link', async () => {
    const src = join(work, 'hard-src');
    await makeTree(src, { 'a.txt': { type: 'file', content: 'same\n', mode: 0o644 } });
    spawnSync('ln', [join(src, 'a.txt'), join(src, 'b.txt')]);
    const tar = spawnSync('tar', ['-c', '-C', src, 'a.txt', 'b.txt']);
    fake.handle((_req, res) => {
      res.writeHead(200);
      res.end(tar.stdout);
    });
    const out = join(work, 'hard-out');
    await sandbox.files.downloadDir('/root', out);
    assert.equal(await readFile(join(out, 'b.txt'), 'utf8'), 'same\n');
    await writeFile(join(out, 'a.txt'), 'changed\n');
    assert.equal(await readFile(join(out, 'b.txt'), 'utf8'), 'changed\n', 'one inode');
  });

  test('a download cut short is ConnectionError', async () => {
    const src = join(work, 'cut-src');
    await makeTree(src, { 'big.bin': { type: 'file', content: 'z'.repeat(200_000), mode: 0o644 } });
    const tar = spawnSync('tar', ['-c', '-C', src, '.']).stdout;
    const handler: Handler = (_req, res) => {
      res.writeHead(200, { 'content-length': String(tar.length) });
      res.write(tar.subarray(0, 100_000));
      setImmediate(() => res.destroy());
    };
    fake.handle(handler);
    await assert.rejects(
      sandbox.files.downloadDir('/root', join(work, 'cut-out')),
      ConnectionError,
    );
  });
});
