/**
 * The routes between nodes over real HTTP (api/routes/cluster.ts, cluster/peer-http.ts), without
 * VMs: two hostd servers on loopback, each a SandboxManager on the fake hypervisor and a
 * ClusterNode on one in-memory store. A drain through the API hands the sandbox over HTTP (the
 * target fetches its files from the source), the peer routes refuse a request without the
 * cluster's key, and a file is served from an offset with `Range`. The same with real VMs,
 * etcd and HAProxy is in test/integration/cluster.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import type { ClusterNode as WireNode } from '../../src/api/wire/cluster.js';
import { eventually } from '../../testkit/eventually.js';
import type { ErrorBody } from '../../testkit/hostd.js';
import { untilNodesMeet } from '../helpers/cluster-manager.js';
import {
  execStdout,
  startServedNode,
  stopServedNodes,
  type ServedNode,
} from '../helpers/cluster-server.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const API_KEY = 'peer-test-key';
const CLUSTER_KEY = 'the-cluster-secret';
const log = pino({ level: 'silent' });

type Node = ServedNode;

const startNode = (store: MemoryStore, id: string): Promise<Node> =>
  startServedNode(store, id, {
    apiKey: API_KEY,
    clusterKey: CLUSTER_KEY,
    log,
    copies: false,
    drain: 'drainer',
  });

const stdout = execStdout;

describe('routes between nodes', () => {
  const store = new MemoryStore();
  let a: Node;
  let b: Node;

  before(async () => {
    a = await startNode(store, 'a');
    b = await startNode(store, 'b');
    await untilNodesMeet([a.cluster, b.cluster], (r) => r.templates.python?.state === 'ready');
  });

  after(() => stopServedNodes(a, b));

  test('a drain asked through the API moves the sandbox over HTTP; it answers from its new node', async () => {
    const created = await a.api.json<{ id: string }>('POST', '/v1/sandboxes', {
      template: 'python',
    });
    assert.equal(created.status, 200);
    const id = created.body.id;
    if (!a.manager.holds(id)) {
      // Placed on b: drain b instead, the test is symmetric.
      [a, b] = [b, a];
    }
    assert.equal(await stdout(a.api, id, 'set x 41'), '');
    const snap = await a.api.json<{ snapshot_id: string }>('POST', `/v1/sandboxes/${id}/snapshot`);
    assert.equal(snap.status, 200, JSON.stringify(snap.body));
    const res = await b.api.json<WireNode>('POST', `/v1/cluster/nodes/${a.id}/drain`);
    assert.equal(res.status, 202, JSON.stringify(res.body));
    assert.equal(res.body.state, 'draining');
    assert.equal(res.body.drain?.ended_at, null);
    await eventually('the drain to end', () => a.cluster.state === 'drained');
    // Every node shows how it ended: this round's report, all moved, nothing left.
    const seen = await eventually('b to show a drained', async () => {
      const v = await b.api.json<{ nodes: WireNode[] }>('GET', '/v1/cluster');
      const n = v.body.nodes.find((x) => x.id === a.id);
      return n?.state === 'drained' ? n : null;
    });
    assert.equal(seen.drain?.started_at, res.body.drain.started_at);
    assert.deepEqual(
      { ...seen.drain, started_at: 0, ended_at: typeof seen.drain.ended_at },
      {
        started_at: 0,
        ended_at: 'string',
        moved: 1,
        left: 0,
        snapshots_moved: 1,
        snapshots_left: 0,
        left_sandboxes: [],
        left_snapshots: [],
        undrained_at: null,
      },
    );
    assert.equal(b.manager.holds(id), true);
    assert.equal(a.manager.holds(id), false);
    const info = await a.api.json<{ node: string; state: string }>('GET', `/v1/sandboxes/${id}`);
    assert.equal(info.body.node, b.id);
    assert.equal(await stdout(a.api, id, 'get x'), '41');
    assert.equal((await a.api.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    // Its snapshot moved too: a create from it through the drained node is made on b.
    const snapshotId = snap.body.snapshot_id;
    assert.equal(b.manager.holdsSnapshot(snapshotId), true);
    assert.equal(a.manager.holdsSnapshot(snapshotId), false);
    const child = await a.api.json<{ id: string }>('POST', '/v1/sandboxes', {
      snapshot: snapshotId,
    });
    assert.equal(child.status, 200, JSON.stringify(child.body));
    assert.equal(b.manager.holds(child.body.id), true);
    assert.equal(await stdout(a.api, child.body.id, 'get x'), '41');
    assert.equal((await a.api.request('DELETE', `/v1/sandboxes/${child.body.id}`)).status, 204);
    assert.equal((await a.api.request('DELETE', `/v1/snapshots/${snapshotId}`)).status, 204);
  });

  test('forgetting a node is refused while it is alive (409), and 404 for a node the catalog never named', async () => {
    const alive = await a.api.json<ErrorBody>('DELETE', `/v1/cluster/nodes/${b.id}`);
    assert.equal(alive.status, 409, JSON.stringify(alive.body));
    assert.equal(alive.body.code, 'cluster_conflict');
    const self = await a.api.json<ErrorBody>('DELETE', `/v1/cluster/nodes/${a.id}`);
    assert.equal(self.status, 409, JSON.stringify(self.body));
    const unknown = await a.api.json<ErrorBody>('DELETE', '/v1/cluster/nodes/never-was');
    assert.equal(unknown.status, 404, JSON.stringify(unknown.body));
    assert.equal(unknown.body.code, 'node_not_found');
  });

  test('the peer routes refuse a request without the cluster key, even with an API key', async () => {
    for (const [method, path, body] of [
      ['GET', '/v1/cluster/peer/files?path=paused%2Fpause-1%2Fmemory.delta', undefined],
      [
        'POST',
        `/v1/cluster/peer/sandboxes/sbx_${'0'.repeat(32)}/hand-over`,
        { from: 'a', record: {}, manifest: {} },
      ],
      [
        'POST',
        `/v1/cluster/peer/snapshots/snap_${'0'.repeat(32)}/hand-over`,
        { from: 'a', rev: 1, record: {}, manifest: {} },
      ],
      ['GET', `/v1/cluster/peer/snapshots/snap_${'0'.repeat(32)}/export`, undefined],
    ] as const) {
      const res = await a.api.json<ErrorBody>(method, path, body);
      assert.equal(res.status, 401, `${method} ${path}`);
      assert.equal(res.body.code, 'invalid_api_key');
    }
  });

  test('an exported file is served whole, or from an offset with Range; others are 404', async () => {
    const created = await a.api.json<{ id: string }>('POST', '/v1/sandboxes', {
      template: 'python',
    });
    const id = created.body.id;
    const holder = a.manager.holds(id) ? a : b;
    const move = await holder.manager.moveOut(id, 'nowhere');
    try {
      const file = move.manifest.parts.at(-1)!.files[0]!;
      const url = `${holder.url}/v1/cluster/peer/files?path=${encodeURIComponent(file.path)}`;
      const headers = { authorization: `Bearer ${API_KEY}`, 'x-hostd-cluster-key': CLUSTER_KEY };
      const whole = await fetch(url, { headers });
      assert.equal(whole.status, 200);
      const bytes = Buffer.from(await whole.arrayBuffer());
      assert.equal(bytes.length, file.size);
      const tail = await fetch(url, { headers: { ...headers, range: 'bytes=5-' } });
      assert.equal(tail.status, 206);
      assert.equal(tail.headers.get('content-range'), `bytes 5-${file.size - 1}/${file.size}`);
      assert.deepEqual(Buffer.from(await tail.arrayBuffer()), bytes.subarray(5));
      // The template build the machine runs on is served the same way, to a node lacking it,
      // and only with the cluster's key.
      const build = move.manifest.build!.files[0]!;
      const buildUrl = `${holder.url}/v1/cluster/peer/files?path=${encodeURIComponent(build.path)}`;
      const part = await fetch(buildUrl, { headers: { ...headers, range: 'bytes=3-' } });
      assert.equal(part.status, 206);
      assert.equal(Buffer.from(await part.arrayBuffer()).length, build.size - 3);
      const keyless = await fetch(buildUrl, { headers: { authorization: headers.authorization } });
      assert.notEqual(keyless.status, 200);
      await keyless.arrayBuffer();
      const other = await fetch(
        `${holder.url}/v1/cluster/peer/files?path=${encodeURIComponent('sandboxes/x.json')}`,
        { headers },
      );
      assert.equal(other.status, 404);
      assert.equal(((await other.json()) as ErrorBody).code, 'file_not_found');
    } finally {
      move.abort();
    }
    assert.equal((await a.api.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
  });
});

describe('an undrain through the API', () => {
  const store = new MemoryStore();
  let c: Node;
  let d: Node;

  before(async () => {
    c = await startNode(store, 'c');
    d = await startNode(store, 'd');
    await untilNodesMeet([c.cluster, d.cluster], (r) => r.templates.python?.state === 'ready');
  });

  after(() => stopServedNodes(c, d));

  test('asked of another node, returns a drained node to serving (200), and again changes nothing', async () => {
    const drained = await d.api.json<WireNode>('POST', `/v1/cluster/nodes/${c.id}/drain`);
    assert.equal(drained.status, 202, JSON.stringify(drained.body));
    await eventually('c drained', () => c.cluster.state === 'drained');
    const res = await d.api.json<WireNode>('POST', `/v1/cluster/nodes/${c.id}/undrain`);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.state, 'serving');
    assert.equal(res.body.drain?.started_at, drained.body.drain?.started_at);
    assert.ok(res.body.drain?.undrained_at);
    assert.equal(c.cluster.state, 'serving');
    // Idempotent: the node as it is, the same report.
    const again = await c.api.json<WireNode>('POST', `/v1/cluster/nodes/${c.id}/undrain`);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.deepEqual(again.body.drain, res.body.drain);
    await eventually('d to list c serving', async () => {
      const v = await d.api.json<{ nodes: WireNode[] }>('GET', '/v1/cluster');
      return v.body.nodes.find((n) => n.id === c.id)?.state === 'serving';
    });
    const body = await c.api.json<ErrorBody>('POST', `/v1/cluster/nodes/${c.id}/undrain`, {});
    assert.equal(body.status, 400);
    assert.equal(body.body.code, 'invalid_request');
  });

  test('a node no one knows is 404 node_not_found; a node that is down is 409 cluster_conflict', async () => {
    for (const via of [c, d]) {
      const res = await via.api.json<ErrorBody>('POST', '/v1/cluster/nodes/never-was/undrain');
      assert.equal(res.status, 404, JSON.stringify(res.body));
      assert.equal(res.body.code, 'node_not_found');
    }
    // d holds a sandbox and stops answering for the cluster: GET /v1/cluster lists it down.
    await d.manager.create({ template: 'python' });
    await d.cluster.writer.settle(5000);
    await d.cluster.stop();
    await eventually('c to list d down', () =>
      c.cluster.info().nodes.some((n) => n.id === 'd' && n.state === 'down'),
    );
    const res = await c.api.json<ErrorBody>('POST', `/v1/cluster/nodes/${d.id}/undrain`);
    assert.equal(res.status, 409, JSON.stringify(res.body));
    assert.equal(res.body.code, 'cluster_conflict');
  });

  test('a node whose hostd stops is 409 cluster_conflict, and stays draining', async () => {
    // What main's stop does first on SIGTERM or SIGINT.
    await c.cluster.leave();
    const res = await c.api.json<ErrorBody>('POST', `/v1/cluster/nodes/${c.id}/undrain`);
    assert.equal(res.status, 409, JSON.stringify(res.body));
    assert.equal(res.body.code, 'cluster_conflict');
    const v = await c.api.json<{ nodes: WireNode[] }>('GET', '/v1/cluster');
    assert.equal(v.body.nodes.find((n) => n.id === c.id)?.state, 'draining');
  });
});
