/**
 * The calls of docs/api.md beyond exec, fork and merge, against a fake: create's template,
 * snapshot, env and network; snapshots (take, list, get, delete); pause and resume; templates;
 * and `await using` deleting the sandbox at the end of its scope.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, before, beforeEach, describe, test } from 'node:test';
import {
  ExecutorError,
  Sandbox,
  Snapshot,
  SnapshotNotFoundError,
  Template,
  TemplateNotFoundError,
  type SnapshotInfo,
  type TemplateInfo,
} from '../src/index.js';
import {
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type RecordedRequest,
} from './helpers/fake-hostd.js';

const ID = 'sbx_' + '4'.repeat(32);
const SNAP = 'snap_' + '5'.repeat(32);

const SNAPSHOT: SnapshotInfo = {
  snapshot_id: SNAP,
  source_sandbox_id: ID,
  template: 'python',
  size_bytes: 18874368,
  created_at: '2026-11-23T10:00:00.000Z',
  sandboxes: 0,
};

const TEMPLATE: TemplateInfo = {
  name: 'python',
  default: true,
  state: 'ready',
  error: null,
  memory_mib: 1024,
  vcpus: 1,
  pool_size: 2,
  disk_mib: 4096,
  description: 'Python with the data stack',
  preload: ['numpy'],
  debian_packages: ['python3-numpy'],
  python_packages: [],
  image_key: '3f2a',
  built_at: '2026-11-23T10:00:00Z',
};

function answer(req: RecordedRequest, res: ServerResponse): void {
  const { method, url } = req;
  if (method === 'POST' && url === '/v1/sandboxes')
    return sendJson(res, 200, { id: ID, state: 'ready' });
  if (method === 'POST' && url.endsWith('/snapshot')) return sendJson(res, 200, SNAPSHOT);
  if (method === 'POST' && url.endsWith('/pause'))
    return sendJson(res, 200, { id: ID, state: 'paused' });
  if (method === 'POST' && url.endsWith('/timeout')) {
    return sendJson(res, 200, { id: ID, state: 'ready', timeout: 60, on_timeout: 'pause' });
  }
  if (method === 'POST' && url.endsWith('/resume'))
    return sendJson(res, 200, { id: ID, state: 'ready' });
  if (method === 'GET' && url === '/v1/snapshots')
    return sendJson(res, 200, { snapshots: [SNAPSHOT] });
  if (method === 'GET' && url === `/v1/snapshots/${SNAP}`) return sendJson(res, 200, SNAPSHOT);
  if (url.startsWith('/v1/snapshots/') && method === 'GET') {
    return sendError(res, 404, 'snapshot not found', 'snapshot_not_found');
  }
  if (method === 'GET' && url === '/v1/templates')
    return sendJson(res, 200, { templates: [TEMPLATE] });
  if (method === 'GET' && url === '/v1/templates/python') return sendJson(res, 200, TEMPLATE);
  if (method === 'GET' && url === '/v1/templates/python/log') {
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
    return void res.end('hostd-build-step: debian packages\n');
  }
  if (method === 'GET' && url.startsWith('/v1/templates/')) {
    return sendError(res, 404, 'template "x" does not exist (known: python)', 'template_not_found');
  }
  if (method === 'DELETE') {
    res.writeHead(204);
    return void res.end();
  }
  sendError(res, 404, `no route for ${method} ${url}`, 'route_not_found');
}

/** method, url, parsed body (or null), content-type (or null) of each request since `from`. */
function seen(fake: FakeHostd, from: number): Array<[string, string, unknown, unknown]> {
  return fake.requests
    .slice(from)
    .map((r) => [
      r.method,
      r.url,
      r.body === '' ? null : JSON.parse(r.body),
      r.headers['content-type'] ?? null,
    ]);
}

describe('create, snapshots, pause, templates', () => {
  let fake: FakeHostd;
  let from = 0;
  before(async () => {
    fake = await startFakeHostd(answer);
  });
  beforeEach(() => {
    fake.handle(answer);
    from = fake.requests.length;
  });
  after(() => fake.close());

  test('create sends template, env and network.allow_out as docs/api.md names them', async () => {
    await Sandbox.create({
      baseUrl: fake.url,
      template: 'python-slim',
      env: { MODE: 'test', EMPTY: '' },
      network: { allowOut: ['pypi.org:443', '*.example.com'] },
    });
    await Sandbox.create({ baseUrl: fake.url, network: {} });
    assert.deepEqual(seen(fake, from), [
      [
        'POST',
        '/v1/sandboxes',
        {
          template: 'python-slim',
          env: { MODE: 'test', EMPTY: '' },
          network: { allow_out: ['pypi.org:443', '*.example.com'] },
        },
        'application/json',
      ],
      ['POST', '/v1/sandboxes', { network: { allow_out: [] } }, 'application/json'],
    ]);
  });

  test('create sends metadata and a lifetime in seconds; setTimeout sets or removes it', async () => {
    const sandbox = await Sandbox.create({
      baseUrl: fake.url,
      metadata: { run: '7' },
      timeoutMs: 1500,
      onTimeout: 'pause',
    });
    const info = await sandbox.setTimeout(60_000, { onTimeout: 'pause' });
    assert.equal(info.on_timeout, 'pause');
    await sandbox.setTimeout(null);
    assert.deepEqual(seen(fake, from), [
      [
        'POST',
        '/v1/sandboxes',
        { metadata: { run: '7' }, timeout: 1.5, on_timeout: 'pause' },
        'application/json',
      ],
      [
        'POST',
        `/v1/sandboxes/${ID}/timeout`,
        { timeout: 60, on_timeout: 'pause' },
        'application/json',
      ],
      ['POST', `/v1/sandboxes/${ID}/timeout`, { timeout: null }, 'application/json'],
    ]);
  });

  test('snapshot() takes a snapshot; create({ snapshot }) takes it or its id', async () => {
    const sandbox = await Sandbox.create({ baseUrl: fake.url });
    const snap = await sandbox.snapshot();
    assert.ok(snap instanceof Snapshot);
    assert.equal(snap.id, SNAP);
    assert.deepEqual(snap.info, SNAPSHOT);
    assert.equal(String(snap), SNAP);
    await Sandbox.create({ baseUrl: fake.url, snapshot: snap });
    await Sandbox.create({ baseUrl: fake.url, snapshot: SNAP });
    await sandbox.snapshot({ name: 'base:v1' });
    assert.deepEqual(seen(fake, from), [
      ['POST', '/v1/sandboxes', {}, 'application/json'],
      ['POST', `/v1/sandboxes/${ID}/snapshot`, null, null],
      ['POST', '/v1/sandboxes', { snapshot: SNAP }, 'application/json'],
      ['POST', '/v1/sandboxes', { snapshot: SNAP }, 'application/json'],
      ['POST', `/v1/sandboxes/${ID}/snapshot`, { name: 'base:v1' }, 'application/json'],
    ]);
  });

  test('Snapshot.list, Snapshot.get and delete', async () => {
    const conn = { baseUrl: fake.url, apiKey: 'k' };
    const list = await Snapshot.list(conn);
    assert.deepEqual(
      list.map((s) => [s.id, s.info]),
      [[SNAP, SNAPSHOT]],
    );
    const one = await Snapshot.get(SNAP, conn);
    assert.deepEqual(one.info, SNAPSHOT);
    await one.delete();
    await assert.rejects(Snapshot.get('snap_missing', conn), SnapshotNotFoundError);
    assert.deepEqual(seen(fake, from), [
      ['GET', '/v1/snapshots', null, null],
      ['GET', `/v1/snapshots/${SNAP}`, null, null],
      ['DELETE', `/v1/snapshots/${SNAP}`, null, null],
      ['GET', '/v1/snapshots/snap_missing', null, null],
    ]);
    for (const r of fake.requests.slice(from)) assert.equal(r.headers.authorization, 'Bearer k');
  });

  test('pause and resume are bodiless POSTs', async () => {
    const sandbox = await Sandbox.create({ baseUrl: fake.url });
    await sandbox.pause();
    await sandbox.resume();
    assert.deepEqual(seen(fake, from).slice(1), [
      ['POST', `/v1/sandboxes/${ID}/pause`, null, null],
      ['POST', `/v1/sandboxes/${ID}/resume`, null, null],
    ]);
  });

  test('Template.list, Template.get and Template.log return what the server says', async () => {
    assert.deepEqual(await Template.list({ baseUrl: fake.url }), [TEMPLATE]);
    assert.deepEqual(await Template.get('python', { baseUrl: fake.url }), TEMPLATE);
    await assert.rejects(Template.get('nope', { baseUrl: fake.url }), TemplateNotFoundError);
    assert.equal(
      await Template.log('python', { baseUrl: fake.url }),
      'hostd-build-step: debian packages\n',
    );
    await assert.rejects(Template.log('nope', { baseUrl: fake.url }), TemplateNotFoundError);
    assert.deepEqual(
      seen(fake, from).map(([m, u]) => [m, u]),
      [
        ['GET', '/v1/templates'],
        ['GET', '/v1/templates/python'],
        ['GET', '/v1/templates/nope'],
        ['GET', '/v1/templates/python/log'],
        ['GET', '/v1/templates/nope/log'],
      ],
    );
  });
});

describe('await using', () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd(answer);
  });
  after(() => fake.close());

  test('deletes the sandbox when the scope ends', async () => {
    const from = fake.requests.length;
    {
      await using sandbox = await Sandbox.create({ baseUrl: fake.url });
      assert.equal(sandbox.id, ID);
      assert.equal(fake.requests.length, from + 1, 'nothing deleted inside the scope');
    }
    assert.deepEqual(
      fake.requests.slice(from).map((r) => [r.method, r.url]),
      [
        ['POST', '/v1/sandboxes'],
        ['DELETE', `/v1/sandboxes/${ID}`],
      ],
    );
  });

  test('a sandbox already gone is no error; any other failure is', async () => {
    fake.handle((req, res) =>
      req.method === 'DELETE'
        ? sendError(res, 404, `sandbox ${ID} not found`, 'sandbox_not_found')
        : answer(req, res),
    );
    {
      await using sandbox = await Sandbox.create({ baseUrl: fake.url });
      assert.equal(sandbox.id, ID);
    }
    fake.handle((req, res) =>
      req.method === 'DELETE'
        ? sendError(res, 500, 'could not delete: qemu hung', 'executor_error')
        : answer(req, res),
    );
    await assert.rejects(async () => {
      await using sandbox = await Sandbox.create({ baseUrl: fake.url });
      assert.equal(sandbox.id, ID);
    }, ExecutorError);
  });
});
