/**
 * Snapshots on any node (core/cluster/snapshot-copies.ts, docs/cluster.md), without VMs: three
 * hostd servers on loopback, each a SandboxManager on the fake hypervisor and a ClusterNode on
 * one in-memory store, the peers over real HTTP. A create from a snapshot whose node is full is
 * made on another node, which fetches the snapshot's files and joins the entry's copies; the next
 * create finds the copy and fetches nothing; a delete removes every copy; a snapshot whose node
 * is down is served from a live copy. A paused sandbox whose node is full moves, on its next use,
 * to a node with room. The same with real VMs is in
 * test/integration/cluster.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { HttpPeers } from '../../src/cluster/peer-http.js';
import type { SnapshotExport } from '../../src/core/cluster/hand-over.js';
import type { NodeRecord, SnapshotEntry } from '../../src/core/cluster/records.js';
import { KEYS } from '../../src/core/cluster/records.js';
import type { ManagerOptions } from '../../src/core/sandbox-manager.js';
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

const API_KEY = 'copies-test-key';
const CLUSTER_KEY = 'the-cluster-secret';
const log = pino({ level: 'silent' });

/** HTTP peers that count the snapshot exports asked (each is a copy's fetch). */
class CountingPeers extends HttpPeers {
  exports = 0;
  override exportSnapshot(from: NodeRecord, id: string): Promise<SnapshotExport> {
    this.exports++;
    return super.exportSnapshot(from, id);
  }
}

type Node = ServedNode<CountingPeers>;

const startNode = (
  store: MemoryStore,
  id: string,
  overrides: Partial<ManagerOptions> = {},
): Promise<Node> =>
  startServedNode(store, id, {
    apiKey: API_KEY,
    clusterKey: CLUSTER_KEY,
    log,
    overrides,
    peers: (options) => new CountingPeers(options),
  });

const stop = (n: Node): Promise<void> => stopServedNodes(n);

const stdout = execStdout;

async function entryOf(store: MemoryStore, id: string): Promise<SnapshotEntry | null> {
  const e = await store.client().get(KEYS.snapshot(id));
  return e ? (JSON.parse(e.value) as SnapshotEntry) : null;
}

describe('snapshots on any node', () => {
  const store = new MemoryStore();
  let a: Node;
  let b: Node;
  let c: Node;
  /** Sandbox ids made by the tests, deleted after each. */
  const made: string[] = [];

  /** A snapshot of a sandbox on a (`x` set to `value`), its sandbox deleted: a is empty again. */
  const snapshotOnA = async (value: number): Promise<string> => {
    const source = await a.manager.create({ template: 'python' });
    assert.equal(await stdout(a.api, source.id, `set x ${value}`), '');
    const snap = await a.api.json<{ snapshot_id: string }>(
      'POST',
      `/v1/sandboxes/${source.id}/snapshot`,
    );
    assert.equal(snap.status, 200, JSON.stringify(snap.body));
    await a.manager.delete(source.id);
    const id = snap.body.snapshot_id;
    for (const n of [b, c]) {
      await eventually(`${n.id} to see the snapshot`, () =>
        n.cluster.view.snapshots.has(id) ? true : null,
      );
    }
    return id;
  };

  /** A create from `snapshot` asked of `via`: the sandbox, and the node that made it. */
  const createFrom = async (via: Node, snapshot: string): Promise<{ id: string; node: string }> => {
    const res = await via.api.json<{ id: string }>('POST', '/v1/sandboxes', { snapshot });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    made.push(res.body.id);
    const info = await via.api.json<{ node: string }>('GET', `/v1/sandboxes/${res.body.id}`);
    return { id: res.body.id, node: info.body.node };
  };

  before(async () => {
    // a takes one sandbox at most: one running there makes it full.
    a = await startNode(store, 'a', { maxSandboxes: 1 });
    b = await startNode(store, 'b');
    c = await startNode(store, 'c');
    await untilNodesMeet(
      [a.cluster, b.cluster, c.cluster],
      (r) => r.templates.python?.state === 'ready',
    );
  });

  after(async () => {
    await stopServedNodes(a, b, c);
  });

  test('a create from a snapshot whose node is full is made on another, which copies the snapshot', async () => {
    const snap = await snapshotOnA(41);
    const filler = await a.manager.create({ template: 'python' });
    try {
      // a refuses (full): b, which received the create, fetches the snapshot and makes it.
      const child = await createFrom(b, snap);
      assert.equal(child.node, 'b');
      assert.equal(await stdout(c.api, child.id, 'get x'), '41');
      assert.equal(b.manager.holdsSnapshot(snap), true);
      assert.equal(b.peers.exports, 1);
      assert.deepEqual((await entryOf(store, snap))?.copies, ['b']);
      assert.equal((await entryOf(store, snap))?.node, 'a', 'the entry stays its node’s');
      // The next create (asked of c) goes to the copy on b: nothing is fetched again.
      await eventually('c to see the copy', () =>
        c.cluster.view.snapshots.get(snap)?.value.copies?.includes('b') ? true : null,
      );
      const again = await createFrom(c, snap);
      assert.equal(again.node, 'b');
      assert.equal(b.peers.exports + c.peers.exports, 1);
      assert.equal(await stdout(a.api, again.id, 'get x'), '41');
      // Listed once, with the sandboxes made from it.
      const list = await c.api.json<{ snapshots: { snapshot_id: string; sandboxes: number }[] }>(
        'GET',
        '/v1/snapshots',
      );
      assert.deepEqual(
        list.body.snapshots.filter((s) => s.snapshot_id === snap).map((s) => s.sandboxes),
        [2],
      );
    } finally {
      await a.manager.delete(filler.id);
      for (const id of made.splice(0)) await b.api.request('DELETE', `/v1/sandboxes/${id}`);
    }
    // A delete (asked of c, which holds nothing) removes the snapshot on a and the copy on b.
    assert.equal((await c.api.request('DELETE', `/v1/snapshots/${snap}`)).status, 204);
    assert.equal(await entryOf(store, snap), null);
    assert.equal(a.manager.holdsSnapshot(snap), false);
    await eventually('b to drop its copy', () => !b.manager.holdsSnapshot(snap));
    const gone = await b.api.json<ErrorBody>('POST', '/v1/sandboxes', { snapshot: snap });
    assert.equal(gone.status, 404);
    assert.equal(gone.body.code, 'snapshot_not_found');
  });

  test('a create from a snapshot whose node drains is made elsewhere; two at once fetch it once', async () => {
    const snap = await snapshotOnA(7);
    await a.cluster.setState('draining');
    try {
      const [one, two] = await Promise.all([createFrom(c, snap), createFrom(c, snap)]);
      assert.equal(one.node, 'c');
      assert.equal(two.node, 'c');
      assert.equal(c.peers.exports, 1);
      assert.equal(await stdout(b.api, two.id, 'get x'), '7');
    } finally {
      await a.cluster.setState('serving');
      for (const id of made.splice(0)) await c.api.request('DELETE', `/v1/sandboxes/${id}`);
    }
    assert.equal((await b.api.request('DELETE', `/v1/snapshots/${snap}`)).status, 204);
    await eventually('c to drop its copy', () => !c.manager.holdsSnapshot(snap));
  });

  test('a paused sandbox whose node is full is moved to a node with room on its next use', async () => {
    const paused: string[] = [];
    for (const value of [8, 9]) {
      const s = await a.manager.create({ template: 'python' });
      paused.push(s.id);
      assert.equal(await stdout(a.api, s.id, `set x ${value}`), '');
      assert.equal((await a.api.request('POST', `/v1/sandboxes/${s.id}/pause`)).status, 200);
    }
    const [viaOther, viaHolder] = paused as [string, string];
    const filler = await a.manager.create({ template: 'python' });
    try {
      // a is full: an exec asked of c, and one asked of a itself, find it moved, resumed there.
      for (const [id, api, value] of [
        [viaOther, c.api, '8'],
        [viaHolder, a.api, '9'],
      ] as const) {
        assert.equal(await stdout(api, id, 'get x'), value);
        const info = await c.api.json<{ node: string; state: string }>(
          'GET',
          `/v1/sandboxes/${id}`,
        );
        assert.notEqual(info.body.node, 'a');
        assert.equal(info.body.state, 'ready');
        assert.equal(a.manager.holds(id), false);
      }
    } finally {
      await a.manager.delete(filler.id);
      for (const id of paused) await c.api.request('DELETE', `/v1/sandboxes/${id}`);
    }
  });

  test('a snapshot whose node is down is served from a live copy; deleting it removes the copies', async () => {
    const snap = await snapshotOnA(5);
    const filler = await a.manager.create({ template: 'python' });
    const first = await createFrom(b, snap);
    assert.equal(first.node, 'b');
    await a.manager.delete(filler.id);
    await stop(a);
    await eventually('c to see a gone', () => !c.cluster.view.nodes.has('a'));
    // Asked of c: the copy on b serves it (info, creates).
    const info = await c.api.json<{ snapshot_id: string }>('GET', `/v1/snapshots/${snap}`);
    assert.equal(info.status, 200, JSON.stringify(info.body));
    const child = await createFrom(c, snap);
    assert.equal(child.node, 'b');
    assert.equal(await stdout(c.api, child.id, 'get x'), '5');
    for (const id of made.splice(0)) await c.api.request('DELETE', `/v1/sandboxes/${id}`);
    // Its node is down: the delete removes the entry here, and b drops its copy.
    assert.equal((await c.api.request('DELETE', `/v1/snapshots/${snap}`)).status, 204);
    assert.equal(await entryOf(store, snap), null);
    await eventually('b to drop its copy', () => !b.manager.holdsSnapshot(snap));
  });
});
