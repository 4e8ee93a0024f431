/**
 * `sbx cp` against a fake that keeps uploaded files and tars in memory: files and directories
 * both ways, `-` for stdin and stdout, a file copied into a directory, and failures as one line.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type RecordedRequest,
} from './helpers/fake-hostd.js';
import { CLI_SUITE_TIMEOUT_MS, sbx } from './helpers/run.js';
import { awkwardTree, makeTree, readTree } from './helpers/tree.js';

const ID = 'sbx_' + 'c'.repeat(32);

/** The sandbox's files as the fake keeps them: a path holds bytes, or a directory's tar. */
const stored = new Map<string, { kind: 'file' | 'dir'; bytes: Buffer; mode: number }>();

function answer(req: RecordedRequest, res: import('node:http').ServerResponse): void {
  const url = new URL(req.url, 'http://fake');
  const path = url.searchParams.get('path') ?? '';
  if (req.method === 'GET' && url.pathname === `/v1/sandboxes/${ID}`) {
    return sendJson(res, 200, { id: ID, state: 'ready' });
  }
  const entry = stored.get(path);
  if (url.pathname.endsWith('/files/stat')) {
    if (!entry) return sendError(res, 404, `${path} does not exist`, 'file_not_found');
    return sendJson(res, 200, {
      name: path.split('/').at(-1),
      path,
      type: entry.kind,
      size: entry.bytes.length,
      mode: entry.mode,
      mtime_ms: 0,
    });
  }
  if (req.method === 'PUT') {
    const tar = req.headers['content-type'] === 'application/x-tar';
    const mode = parseInt(url.searchParams.get('mode') ?? '644', 8);
    stored.set(path, { kind: tar ? 'dir' : 'file', bytes: req.bytes, mode });
    return sendJson(res, 200, { path, size: req.bytes.length });
  }
  if (req.method === 'GET' && entry) {
    res.writeHead(200, { 'content-length': String(entry.bytes.length) });
    return void res.end(entry.bytes);
  }
  sendError(res, 404, `${path} does not exist`, 'file_not_found');
}

describe('sbx cp', { timeout: CLI_SUITE_TIMEOUT_MS }, () => {
  let fake: FakeHostd;
  let work: string;
  before(async () => {
    fake = await startFakeHostd(answer);
    work = await mkdtemp(join(tmpdir(), 'hostd-sbx-cp-'));
  });
  after(async () => {
    await fake.close();
    await rm(work, { recursive: true, force: true });
  });
  const cp = (src: string, dest: string, input?: string) =>
    sbx(['cp', src, dest, '--url', fake.url], { cwd: work, input });

  test('a file up and back down, keeping its mode', async () => {
    await writeFile(join(work, 'run.sh'), '#!/bin/sh\n', { mode: 0o750 });
    let r = await cp('run.sh', `${ID}:/root/run.sh`);
    assert.deepEqual([r.code, r.stdout, r.stderr], [0, '', '']);
    assert.equal(
      fake.requests.at(-1)!.url,
      `/v1/sandboxes/${ID}/files?path=%2Froot%2Frun.sh&mode=0750`,
    );
    r = await cp(`${ID}:/root/run.sh`, 'back.sh');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await readFile(join(work, 'back.sh'), 'utf8'), '#!/bin/sh\n');
    assert.deepEqual(
      (await readdir(work)).filter((f) => f.includes('partial')),
      [],
      'no partial file left',
    );
  });

  test('a file into a directory: remote, or local, by its own name', async () => {
    stored.set('/root/dir', { kind: 'dir', bytes: Buffer.alloc(0), mode: 0o755 });
    await writeFile(join(work, 'note.txt'), 'note\n');
    let r = await cp('note.txt', `${ID}:/root/dir`);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(stored.get('/root/dir/note.txt')?.bytes.toString(), 'note\n');
    await mkdir(join(work, 'local-dir'));
    r = await cp(`${ID}:/root/dir/note.txt`, 'local-dir');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await readFile(join(work, 'local-dir', 'note.txt'), 'utf8'), 'note\n');
  });

  test('a directory up as one tar stream and back down as the same tree', async () => {
    await makeTree(join(work, 'tree'), awkwardTree());
    let r = await cp('tree', `${ID}:/root/tree`);
    assert.equal(r.code, 0, r.stderr);
    const put = fake.requests.at(-1)!;
    assert.equal(put.headers['content-type'], 'application/x-tar');
    const unpacked = join(work, 'unpacked');
    await mkdir(unpacked);
    assert.equal(spawnSync('tar', ['-x', '-C', unpacked], { input: put.bytes }).status, 0);
    assert.deepEqual(await readTree(unpacked), await readTree(join(work, 'tree')));
    r = await cp(`${ID}:/root/tree`, 'tree-back');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(
      fake.requests.at(-1)!.url,
      `/v1/sandboxes/${ID}/files?path=%2Froot%2Ftree&format=tar`,
    );
    assert.deepEqual(await readTree(join(work, 'tree-back')), await readTree(join(work, 'tree')));
  });

  test('- reads stdin and writes stdout', async () => {
    let r = await cp('-', `${ID}:/root/in.txt`, 'from stdin\n');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(stored.get('/root/in.txt')?.bytes.toString(), 'from stdin\n');
    r = await cp(`${ID}:/root/in.txt`, '-');
    assert.deepEqual([r.code, r.stdout], [0, 'from stdin\n']);
  });

  test('mistakes and failures: one line each', async () => {
    let r = await cp('a', 'b');
    assert.equal(r.code, 2);
    r = await cp(`${ID}:/a`, `${ID}:/b`);
    assert.equal(r.code, 2);
    r = await cp(`${ID}:/root/missing`, 'x');
    assert.deepEqual([r.code, r.stderr], [1, 'sbx: not found: /root/missing does not exist\n']);
    r = await cp('no-such-local-file', `${ID}:/root/x`);
    assert.equal(r.code, 1);
    assert.equal(r.stderr.split('\n').length, 2, r.stderr);
  });
});
