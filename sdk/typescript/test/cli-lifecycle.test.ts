/**
 * The `sbx` commands beyond exec, fork and merge, against a fake: create's flags, snapshot,
 * snapshots (list and rm), pause, resume, templates, and exec's --env, --cwd and --display-dir.
 */
import assert from 'node:assert/strict';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  eventLine,
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type RecordedRequest,
} from './helpers/fake-hostd.js';
import { CLI_SUITE_TIMEOUT_MS, sbx } from './helpers/run.js';

const ID = 'sbx_' + 'd'.repeat(32);
const SNAP = 'snap_' + 'e'.repeat(32);
const SNAPSHOT = {
  snapshot_id: SNAP,
  source_sandbox_id: ID,
  template: 'python',
  size_bytes: 18874368,
  created_at: '2026-11-23T10:00:00.000Z',
  sandboxes: 1,
};
const TEMPLATES = [
  {
    name: 'python',
    default: true,
    state: 'ready',
    memory_mib: 1024,
    vcpus: 1,
    pool_size: 2,
    disk_mib: 4096,
    description: 'Python with the data stack',
  },
  {
    name: 'python-slim',
    default: false,
    state: 'building',
    memory_mib: 512,
    vcpus: 1,
    pool_size: 2,
    disk_mib: 1024,
    description: 'the standard library only',
  },
];
const PNG = Buffer.from('\x89PNG fake bytes', 'latin1');

function answer(req: RecordedRequest, res: ServerResponse): void {
  const { method, url } = req;
  if (method === 'POST' && url === '/v1/sandboxes')
    return sendJson(res, 200, { id: ID, state: 'ready' });
  if (method === 'GET' && url === `/v1/sandboxes/${ID}`)
    return sendJson(res, 200, { id: ID, state: 'ready' });
  if (url.endsWith('/snapshot')) return sendJson(res, 200, SNAPSHOT);
  if (url.endsWith('/pause')) return sendJson(res, 200, { id: ID, state: 'paused' });
  if (url.endsWith('/resume')) return sendJson(res, 200, { id: ID, state: 'ready' });
  if (url === '/v1/snapshots') return sendJson(res, 200, { snapshots: [SNAPSHOT] });
  if (url === `/v1/snapshots/${SNAP}`) {
    if (method === 'GET') return sendJson(res, 200, SNAPSHOT);
    res.writeHead(204);
    return void res.end();
  }
  if (url.startsWith('/v1/snapshots/'))
    return sendError(res, 404, 'snapshot snap_x not found', 'snapshot_not_found');
  if (url === '/v1/templates') return sendJson(res, 200, { templates: TEMPLATES });
  if (url.endsWith('/exec')) {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(eventLine('stdout', 'before', 0));
    res.write(
      eventLine('display', { 'image/png': PNG.toString('base64'), 'text/plain': '<Figure>' }, 1),
    );
    res.write(eventLine('display', { 'text/html': '<table/>', 'text/plain': '   a\n0  1' }, 2));
    res.write(eventLine('display', { 'image/svg+xml': '<svg/>', 'text/plain': 'svg' }, 3));
    return void res.end(eventLine('exit', 0, 4));
  }
  sendError(res, 404, `no route for ${method} ${url}`, 'route_not_found');
}

describe('sbx lifecycle commands', { timeout: CLI_SUITE_TIMEOUT_MS }, () => {
  let fake: FakeHostd;
  let work: string;
  before(async () => {
    fake = await startFakeHostd(answer);
    work = await mkdtemp(join(tmpdir(), 'hostd-sbx-life-'));
  });
  after(async () => {
    await fake.close();
    await rm(work, { recursive: true, force: true });
  });
  const run = (args: string[]) => sbx([...args, '--url', fake.url], { cwd: work });
  const lastBody = (): unknown => JSON.parse(fake.requests.at(-1)!.body);

  test('create passes --template, --env and --allow-out; --snapshot', async () => {
    let r = await run([
      'create',
      '--template',
      'python-slim',
      '--env',
      'A=1',
      '--env',
      'B=x=y',
      '--allow-out',
      'pypi.org:443',
      '--allow-out',
      '*',
    ]);
    assert.deepEqual([r.code, r.stdout], [0, `${ID}\n`]);
    assert.deepEqual(lastBody(), {
      template: 'python-slim',
      env: { A: '1', B: 'x=y' },
      network: { allow_out: ['pypi.org:443', '*'] },
    });
    r = await run(['create', '--snapshot', SNAP]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(lastBody(), { snapshot: SNAP });
    r = await run(['create', '--env', 'NOVALUE']);
    assert.equal(r.code, 2);
  });

  test('snapshot prints the id; snapshots lists; snapshots rm deletes', async () => {
    let r = await run(['snapshot', ID]);
    assert.deepEqual([r.code, r.stdout], [0, `${SNAP}\n`]);
    r = await run(['snapshots']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.split('\n')[0]!.split(/\s+/), [
      'ID',
      'SOURCE',
      'TEMPLATE',
      'SIZE',
      'SANDBOXES',
      'CREATED',
    ]);
    assert.ok(r.stdout.includes(`${SNAP}  ${ID}  python    18.0 MiB  1`), r.stdout);
    r = await run(['snapshots', '-q']);
    assert.equal(r.stdout, `${SNAP}\n`);
    r = await run(['snapshots', '--json']);
    assert.deepEqual(JSON.parse(r.stdout), [SNAPSHOT]);
    r = await run(['snapshots', 'rm', SNAP, 'snap_x']);
    assert.deepEqual([r.code, r.stderr], [1, 'sbx: not found: snapshot snap_x not found\n']);
    assert.ok(
      fake.requests.some((q) => q.method === 'DELETE' && q.url === `/v1/snapshots/${SNAP}`),
    );
  });

  test('pause and resume', async () => {
    let r = await run(['pause', ID]);
    assert.deepEqual([r.code, r.stdout], [0, '']);
    assert.equal(fake.requests.at(-1)!.url, `/v1/sandboxes/${ID}/pause`);
    r = await run(['resume', ID]);
    assert.deepEqual([r.code, r.stdout], [0, '']);
    assert.equal(fake.requests.at(-1)!.url, `/v1/sandboxes/${ID}/resume`);
  });

  test('templates lists them, the default marked', async () => {
    let r = await run(['templates']);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split('\n');
    assert.deepEqual(lines[0]!.split(/\s+/), [
      'NAME',
      'STATE',
      'MEMORY',
      'VCPUS',
      'DISK',
      'POOL',
      'DESCRIPTION',
    ]);
    assert.ok(lines[1]!.startsWith('python (default)  ready'), lines[1]);
    assert.ok(lines[2]!.startsWith('python-slim       building'), lines[2]);
    r = await run(['templates', '-q']);
    assert.equal(r.stdout, 'python\npython-slim\n');
  });

  test('exec --env --cwd --display-dir: images to numbered files, their paths printed', async () => {
    await writeFile(join(work, 'display-1.png'), 'already here');
    const r = await run([
      'exec',
      ID,
      '--env',
      'A=1',
      '--cwd',
      '/tmp',
      '--display-dir',
      '.',
      'plot()',
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(lastBody(), {
      code: 'plot()',
      language: 'python',
      env: { A: '1' },
      cwd: '/tmp',
      display: true,
    });
    assert.equal(r.stdout, 'before\ndisplay-2.png\n   a\n0  1\ndisplay-3.svg\n');
    assert.deepEqual(await readFile(join(work, 'display-2.png')), PNG);
    assert.equal(await readFile(join(work, 'display-1.png'), 'utf8'), 'already here');
    assert.equal(await readFile(join(work, 'display-3.svg'), 'utf8'), '<svg/>');
    assert.deepEqual((await readdir(work)).filter((f) => f.startsWith('display-')).sort(), [
      'display-1.png',
      'display-2.png',
      'display-3.svg',
    ]);
  });

  test('exec without --display-dir asks for no displays', async () => {
    const r = await run(['exec', ID, 'x']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(lastBody(), { code: 'x', language: 'python' });
  });
});
