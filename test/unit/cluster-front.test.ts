/**
 * Cluster mode at the HTTP door (api/cluster-front.ts, api/forward.ts), without VMs: two real
 * hostd servers on loopback, each a SandboxManager on the fake hypervisor and a ClusterNode on one
 * in-memory store. Any node serves any sandbox (exec NDJSON, files, info, errors as the holder
 * answers them), lists span both nodes, forks stay on the parent's node, a drained node's creates are
 * placed on the other, and the bearer key travels with the forwarded request. A create of a
 * template no live node serves answers as a single hostd (404), or 503 node_unavailable when
 * only a node that is down served it. The same paths with real VMs, etcd and HAProxy are in
 * test/integration/cluster.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { buildServer } from '../../src/api/server.js';
import { createMetrics } from '../../src/api/metrics.js';
import { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import { fail } from '../../src/errors.js';
import { connect, type Api, type ErrorBody } from '../../testkit/hostd.js';
import { startClusterManager, untilNodesMeet } from '../helpers/cluster-manager.js';
import { MemoryStore } from '../helpers/memory-kv.js';
import { FakeImages, plan } from '../helpers/fake-images.js';
import { eventually } from '../../testkit/eventually.js';

const KEY = 'front-test-key';
const log = pino({ level: 'silent' });

interface Node {
  id: string;
  cluster: ClusterNode;
  manager: SandboxManager;
  app: FastifyInstance;
  api: Api;
}

async function startNode(
  store: MemoryStore,
  id: string,
  overrides: Partial<ManagerOptions> = {},
): Promise<Node> {
  const { cluster, manager } = await startClusterManager(store, id, log, overrides);
  const app = await buildServer({
    manager,
    auth: { kind: 'keys', keys: [KEY] },
    maxBodyBytes: 1 << 20,
    maxFileBytes: 1 << 20,
    logger: log,
    metrics: createMetrics({ accel: 'tcg', version: 'test' }),
    cluster: {
      node: cluster,
      drain: () => void cluster.setState('draining'),
      undrain: () => cluster.setState('serving'),
    },
  });
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  cluster.url = url;
  await cluster.start();
  return { id, cluster, manager, app, api: connect(url, KEY) };
}

/** The NDJSON events of an exec, asked of `api`. */
async function exec(
  api: Api,
  id: string,
  code: string,
): Promise<{ type: string; data: unknown }[]> {
  const res = await api.request('POST', `/v1/sandboxes/${id}/exec`, { code });
  assert.equal(res.status, 200, await res.clone().text());
  assert.match(res.headers.get('content-type') ?? '', /ndjson/);
  return (await res.text())
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { type: string; data: unknown });
}

const stdout = (events: { type: string; data: unknown }[]): unknown[] =>
  events.filter((e) => e.type === 'stdout').map((e) => e.data);

describe('cluster front', () => {
  const store = new MemoryStore();
  let a: Node;
  let b: Node;

  before(async () => {
    a = await startNode(store, 'a');
    b = await startNode(store, 'b');
    await untilNodesMeet([a.cluster, b.cluster]);
  });

  after(async () => {
    for (const n of [a, b]) {
      if (!n) continue;
      await n.app.close();
      await n.manager.shutdown();
      await n.cluster.stop();
    }
  });

  test('a sandbox made on one node is served by the other: exec events, info, list', async () => {
    const made = await a.api.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'python' });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    const id = made.body.id;
    assert.equal(a.manager.holds(id), true);
    assert.equal(b.manager.holds(id), false);
    await exec(b.api, id, 'set x 41');
    assert.deepEqual(stdout(await exec(b.api, id, 'get x')), ['41']);
    const info = await b.api.json<{ id: string; node: string }>('GET', `/v1/sandboxes/${id}`);
    assert.equal(info.status, 200);
    assert.equal(info.body.node, 'a');
    const list = await b.api.json<{ sandboxes: { id: string; node: string }[] }>(
      'GET',
      '/v1/sandboxes',
    );
    assert.deepEqual(
      list.body.sandboxes.filter((s) => s.id === id).map((s) => s.node),
      ['a'],
    );
    // The holder's errors, as it answers them.
    const bad = await b.api.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, { cod: 1 });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.code, 'invalid_request');
    // The client's key is what the holder checks: a wrong one is refused there too.
    const wrong = await connect(b.api.url, 'not-the-key').json<ErrorBody>(
      'GET',
      `/v1/sandboxes/${id}`,
    );
    assert.equal(wrong.status, 401);
    // A file goes in and comes out through the node that does not hold the sandbox.
    const put = await b.api.request(
      'PUT',
      `/v1/sandboxes/${id}/files?path=/tmp/f.txt`,
      'through the hop',
      { 'content-type': 'application/octet-stream' },
    );
    assert.equal(put.status, 200, await put.text());
    const got = await b.api.request('GET', `/v1/sandboxes/${id}/files?path=/tmp/f.txt`);
    assert.equal(got.status, 200);
    assert.equal(await got.text(), 'through the hop');
    const del = await b.api.request('DELETE', `/v1/sandboxes/${id}`);
    assert.equal(del.status, 204);
    assert.equal(a.manager.holds(id), false);
  });

  test("a fork asked of the other node runs on the parent's node", async () => {
    const made = await a.api.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'python' });
    const parent = made.body.id;
    await exec(a.api, parent, 'set y 7');
    const fork = await b.api.json<{ children: { id: string }[] }>(
      'POST',
      `/v1/sandboxes/${parent}/fork`,
      { n: 2 },
    );
    assert.equal(fork.status, 200, JSON.stringify(fork.body));
    for (const c of fork.body.children) {
      assert.equal(a.manager.holds(c.id), true);
      assert.deepEqual(stdout(await exec(b.api, c.id, 'get y')), ['7']);
    }
    for (const id of [...fork.body.children.map((c) => c.id), parent]) {
      assert.equal((await b.api.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    }
  });

  test("a drained node's creates are placed on the other; unknown nodes are 404", async () => {
    const drained = await a.api.json<{ id: string; state: string }>(
      'POST',
      '/v1/cluster/nodes/b/drain',
    );
    assert.equal(drained.status, 202, JSON.stringify(drained.body));
    assert.equal(drained.body.state, 'draining');
    await a.cluster.view.waitFor(
      () => (a.cluster.view.nodes.get('b')?.state === 'draining' ? true : null),
      5000,
    );
    const made = await b.api.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'python' });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    assert.equal(a.manager.holds(made.body.id), true);
    assert.equal((await b.api.request('DELETE', `/v1/sandboxes/${made.body.id}`)).status, 204);
    const none = await b.api.json<ErrorBody>('POST', '/v1/cluster/nodes/zz/drain');
    assert.equal(none.status, 404);
    assert.equal(none.body.code, 'node_not_found');
    const view = await b.api.json<{ nodes: { id: string; state: string }[] }>('GET', '/v1/cluster');
    assert.deepEqual(
      view.body.nodes.map((n) => [n.id, n.state]),
      [
        ['a', 'serving'],
        ['b', 'draining'],
      ],
    );
  });
});

describe('cluster front: creates of a template not every node serves', () => {
  const store = new MemoryStore();
  let p: Node;
  let q: Node;

  before(async () => {
    p = await startNode(store, 'p');
    // q alone serves ruby, and takes one sandbox.
    q = await startNode(store, 'q', {
      templates: [plan('python', { poolSize: 0 }), plan('ruby', { poolSize: 0 })],
      images: new FakeImages(['python', 'ruby']),
      maxSandboxes: 1,
    });
    await untilNodesMeet([p.cluster, q.cluster], (r) => r.templates.python?.state === 'ready');
    await eventually('p to see ruby ready on q', () => {
      return p.cluster.view.nodes.get('q')?.templates.ruby?.state === 'ready';
    });
  });

  after(async () => {
    for (const n of [p, q]) {
      if (!n) continue;
      await n.app.close();
      await n.manager.shutdown();
      await n.cluster.stop();
    }
  });

  test('known to no node: 404 template_not_found, the body a single hostd answers', async () => {
    for (const n of [p, q]) {
      const res = await n.api.json<ErrorBody>('POST', '/v1/sandboxes', { template: 'perl' });
      assert.equal(res.status, 404, JSON.stringify(res.body));
      // Every template the cluster serves is named, as a single hostd names its own.
      const known = n === p ? ['python', 'slim', 'ruby'] : ['python', 'ruby', 'slim'];
      assert.deepEqual(res.body, fail('templateNotFound', 'perl', known).toBody());
    }
  });

  test('known to a full node: its refusal; known only to a node that is down: 503 node_unavailable', async () => {
    const made = await p.api.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'ruby' });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    assert.equal(q.manager.holds(made.body.id), true);
    // q is full: its 429, as today.
    const full = await p.api.json<ErrorBody>('POST', '/v1/sandboxes', { template: 'ruby' });
    assert.equal(full.status, 429, JSON.stringify(full.body));
    assert.equal(full.body.code, 'limit_reached');
    // q stops answering for the cluster; its sandbox's entry still says it served ruby.
    await q.cluster.stop();
    await eventually('p to see q gone', () => !p.cluster.view.nodes.has('q'));
    const down = await p.api.request('POST', '/v1/sandboxes', { template: 'ruby' });
    const body = (await down.json()) as ErrorBody;
    assert.equal(down.status, 503, JSON.stringify(body));
    assert.equal(body.code, 'node_unavailable');
    assert.ok(Number(down.headers.get('retry-after')) > 0);
    // What no node ever served is still 404.
    const none = await p.api.json<ErrorBody>('POST', '/v1/sandboxes', { template: 'perl' });
    assert.equal(none.status, 404, JSON.stringify(none.body));
  });
});
