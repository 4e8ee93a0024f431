/**
 * A hostd as a node of a cluster (core/cluster/cluster-node.ts), two nodes on one in-memory
 * store with etcd's semantics (test/helpers/memory-kv.ts): where a request for a sandbox goes
 * (here, the node holding it, 410 when that node is gone, 503 while etcd is), where a create is
 * placed, what `GET /v1/cluster` shows, deleting what a dead node held, and fencing a copy the
 * catalog no longer gives to the node that comes back with it.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { ClusterNode, type LocalSandboxes } from '../../src/core/cluster/cluster-node.js';
import { memoryRecords, type SandboxRecord, type SnapshotRecord } from '../../src/core/journal.js';
import { KEYS, type SnapshotEntry } from '../../src/core/cluster/records.js';
import { fail, toHostdError } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });
const sbx = (n: number): string => `sbx_${n.toString(16).padStart(32, '0')}`;
const snap = (n: number): string => `snap_${n.toString(16).padStart(32, '0')}`;

/** A node's local side: the sandboxes it holds, and what it was told to fence. */
class Local implements LocalSandboxes {
  readonly held = new Set<string>();
  readonly fenced: string[] = [];
  draining = false;
  holds = (id: string) => this.held.has(id);
  /** Snapshots it holds, and those it was told to drop. */
  readonly snaps = new Set<string>();
  readonly droppedSnapshots: string[] = [];
  holdsSnapshot = (id: string) => this.snaps.has(id);
  snapshotIds = (): string[] => [...this.snaps];
  fence = async (id: string) => {
    this.held.delete(id);
    this.fenced.push(id);
  };
  fenceSnapshot = (id: string) => {
    this.snaps.delete(id);
    this.droppedSnapshots.push(id);
  };
  capacity = () => ({ sandboxes: 10, memory_mib: 8192 });
  load = () => ({ sandboxes: this.held.size, memory_free_mib: 4096 });
  served: Record<string, { state: string; build: string | null }> = {
    python: { state: 'ready', build: 'b1' },
  };
  templates = () => this.served;
}

interface TestNode {
  node: ClusterNode;
  local: Local;
  records: ReturnType<ClusterNode['sandboxRecords']>;
  kv: ReturnType<MemoryStore['client']>;
}

async function join(
  store: MemoryStore,
  id: string,
  held: SandboxRecord[] = [],
  snapshots: string[] = [],
): Promise<TestNode> {
  const kv = store.client();
  const node = new ClusterNode(kv, { id, url: `http://${id}:7070`, version: '0', ttlS: 10, log });
  const local = new Local();
  for (const s of snapshots) local.snaps.add(s);
  node.bind(local);
  const records = node.sandboxRecords(memoryRecords<SandboxRecord>());
  // What a restart re-adopts is recorded before the node joins.
  for (const r of held) {
    local.held.add(r.id);
    records.write(r);
  }
  await node.start();
  return { node, local, records, kv };
}

function record(
  id: string,
  state: SandboxRecord['state'] = 'running',
  template = 'python',
): SandboxRecord {
  return {
    id,
    template,
    parent_id: null,
    snapshot_id: null,
    created_at: '2026-01-01T00:00:00Z',
    state,
  };
}

/** Node `n` creates sandbox `id` and answers once the catalog has it. */
async function createOn(n: TestNode, id: string): Promise<void> {
  n.local.held.add(id);
  n.records.write(record(id));
  await n.node.confirmSandboxes([id]);
}

const code = (err: unknown): string => toHostdError(err, 'test').toBody().code;

async function stopAll(...nodes: TestNode[]): Promise<void> {
  await Promise.all(nodes.map((n) => n.node.stop()));
}

describe('cluster node', () => {
  test('a sandbox is served where it is held; other nodes route to that node', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    await createOn(a, sbx(1));
    assert.deepEqual(await a.node.locateSandbox(sbx(1)), { local: true });
    const route = await b.node.locateSandbox(sbx(1));
    assert.equal(route.local, false);
    assert.equal(!route.local && route.node.url, 'http://a:7070');
    // Unknown and malformed ids are answered here (404).
    assert.deepEqual(await b.node.locateSandbox(sbx(99)), { local: true });
    assert.deepEqual(await b.node.locateSandbox('nope'), { local: true });
    await stopAll(a, b);
  });

  test("a dead node's running sandboxes are lost (410, naming it); deleting one forgets it", async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    await createOn(a, sbx(1));
    await createOn(a, sbx(2));
    // a stops answering: its lease (its record and live keys) goes; the entries stay.
    store.dropLease(a.kv.lease!);
    await assert.rejects(b.node.locateSandbox(sbx(1)), (err) => {
      assert.equal(code(err), 'sandbox_lost');
      assert.match((err as Error).message, /node a/);
      return true;
    });
    const down = b.node.info().nodes.find((n) => n.id === 'a');
    assert.equal(down?.state, 'down');
    assert.equal(down?.sandboxes, 2);
    const listed = b.node.strandedSandboxes().sort((x, y) => x.id.localeCompare(y.id));
    assert.deepEqual(
      listed.map((x) => [x.id, x.state, x.node]),
      [
        [sbx(1), 'failed', 'a'],
        [sbx(2), 'failed', 'a'],
      ],
    );
    assert.match(listed[0]!.error ?? '', /node a/);
    assert.equal(await b.node.forgetStranded(sbx(1)), true);
    assert.deepEqual(await b.node.locateSandbox(sbx(1)), { local: true });
    assert.deepEqual(
      b.node.strandedSandboxes().map((x) => x.id),
      [sbx(2)],
    );
    assert.equal(store.keys.has('sandboxes/' + sbx(1)), false);
    await stopAll(a, b);
  });

  test('a node that comes back fences what was deleted meanwhile and keeps the rest', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    await createOn(a, sbx(1));
    await createOn(a, sbx(2));
    store.dropLease(a.kv.lease!);
    await a.node.stop();
    assert.equal(await b.node.forgetStranded(sbx(1)), true);
    // a restarts with both sandboxes re-adopted from its disk.
    const again = await join(store, 'a', [record(sbx(1), 'paused'), record(sbx(2), 'paused')]);
    await eventually('the deleted sandbox to be fenced', () => again.local.fenced.length === 1);
    assert.deepEqual(again.local.fenced, [sbx(1)]);
    assert.equal(
      store.read<{ node: string; state: string }>('sandboxes/' + sbx(2))?.state,
      'paused',
    );
    const route = await b.node.locateSandbox(sbx(2));
    assert.equal(!route.local && route.node.id, 'a');
    await stopAll(again, b);
  });

  test('a paused sandbox on a node that is down answers 503 node_unavailable', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    a.local.held.add(sbx(3));
    a.records.write(record(sbx(3), 'paused'));
    await a.node.confirmSandboxes([sbx(3)]);
    await a.node.stop();
    await assert.rejects(b.node.locateSandbox(sbx(3)), (err) => code(err) === 'node_unavailable');
    // A delete through another node forgets it too; a comes back and fences its copy.
    assert.equal(await b.node.forgetStranded(sbx(3)), true);
    await stopAll(b);
  });

  test('creates go to the least loaded serving node; a draining node gets none', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    await createOn(a, sbx(1));
    await createOn(a, sbx(2));
    await eventually('b to see a publish its load', () => b.node.view.liveCount('a') === 2);
    const order = await b.node.placeCreate({ template: 'python' });
    assert.deepEqual(
      order.map((n) => n.id),
      ['b', 'a'],
    );
    await b.node.setState('draining');
    await eventually('a to see b draining', () => a.node.view.nodes.get('b')?.state === 'draining');
    assert.deepEqual(
      (await a.node.placeCreate({ template: 'python' })).map((n) => n.id),
      ['a'],
    );
    await stopAll(a, b);
  });

  test('a template no live node serves: 404 when no node knows it, 503 node_unavailable when only a node that is down does', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    a.local.served = { ...a.local.served, ruby: { state: 'ready', build: 'r1' } };
    await a.node.setState('serving'); // publishes its record with ruby
    const b = await join(store, 'b');
    await eventually(
      'b to see ruby on a',
      () => 'ruby' in (b.node.view.nodes.get('a')?.templates ?? {}),
    );
    assert.deepEqual(
      (await b.node.placeCreate({ template: 'ruby' })).map((n) => n.id),
      ['a'],
    );
    // Known to no node: what a single hostd answers, naming every template the cluster serves.
    for (const n of [a, b]) {
      await assert.rejects(n.node.placeCreate({ template: 'nope' }), (err) => {
        assert.deepEqual(
          toHostdError(err, 'test').toBody(),
          fail('templateNotFound', 'nope', ['python', 'ruby']).toBody(),
        );
        return true;
      });
    }
    // Known to a live node that takes no creates now (draining, full): no order; the front
    // answers 503 insufficient_resources as for a full cluster.
    await a.node.setState('draining');
    await eventually('b to see a draining', () => b.node.view.nodes.get('a')?.state === 'draining');
    assert.deepEqual(await b.node.placeCreate({ template: 'ruby' }), []);
    // Known only to a node that is down (its sandbox of it says so): 503 node_unavailable.
    a.local.held.add(sbx(5));
    a.records.write(record(sbx(5), 'running', 'ruby'));
    await a.node.confirmSandboxes([sbx(5)]);
    await eventually('b to see the sandbox', () => b.node.view.sandboxes.has(sbx(5)));
    await a.node.stop();
    await eventually('b to see a gone', () => !b.node.view.nodes.has('a'));
    await assert.rejects(b.node.placeCreate({ template: 'ruby' }), (err) => {
      const e = toHostdError(err, 'test');
      assert.deepEqual([e.status, e.code, e.params[1]], [503, 'node_unavailable', 'a']);
      assert.ok(e.retryAfterS !== undefined && e.retryAfterS > 0);
      return true;
    });
    // Still unknown once a is gone: 404, naming what the live nodes serve.
    await assert.rejects(b.node.placeCreate({ template: 'nope' }), (err) => {
      assert.deepEqual(
        toHostdError(err, 'test').toBody(),
        fail('templateNotFound', 'nope', ['python']).toBody(),
      );
      return true;
    });
    await stopAll(b);
  });

  test('a create from a snapshot asks the nodes holding it first, however loaded, then the others; by name, the newest', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    const snaps = (n: TestNode) => n.node.snapshotRecords(memoryRecords<SnapshotRecord>());
    const snapshot = async (n: TestNode, id: string, name: string | null, at: string) => {
      const records = snaps(n);
      records.write({
        id,
        source_sandbox_id: sbx(1),
        template: 'python',
        created_at: at,
        size_bytes: 1,
        name,
        state: { format: 1, id: 'st', kind: 'template' } as unknown as SnapshotRecord['state'],
      });
      await records.flush(); // in the catalog once durable, as Snapshots does
      await n.node.confirmSnapshot(id);
    };
    await snapshot(a, snap(1), 'ckpt', '2026-01-01T00:00:00.000Z');
    await snapshot(b, snap(2), 'ckpt', '2026-01-02T00:00:00.000Z');
    await snapshot(a, snap(3), 'other', '2026-01-03T00:00:00.000Z');
    // a is the busier node: a template create goes to b, a snapshot's to a first all the same
    // (no fetch there), then to b (which fetches it) when a refuses.
    await createOn(a, sbx(1));
    await createOn(a, sbx(2));
    for (const n of [a, b]) {
      await eventually(`${n.node.id} to see the catalog`, () =>
        n.node.view.liveCount('a') === 2 && n.node.view.snapshots.size === 3 ? true : null,
      );
      assert.deepEqual(
        (await n.node.placeCreate({ template: 'python' })).map((x) => x.id),
        ['b', 'a'],
      );
      assert.deepEqual(
        (await n.node.placeCreate({ snapshot: snap(1) })).map((x) => x.id),
        ['a', 'b'],
        'its holder first, then the others',
      );
      assert.deepEqual(n.node.snapshotByName('ckpt'), {
        id: snap(2),
        node: 'b',
        created_at: '2026-01-02T00:00:00.000Z',
      });
      assert.equal(n.node.snapshotByName('other')?.id, snap(3));
      assert.equal(n.node.snapshotByName('nope'), null);
    }
    // With a copy on b, the least loaded of its holders comes first: b.
    const key = KEYS.snapshot(snap(1));
    const stored = (await b.kv.get(key))!;
    const entry = JSON.parse(stored.value) as SnapshotEntry;
    await b.kv.txn([], [{ put: key, value: JSON.stringify({ ...entry, copies: ['b'] }) }]);
    await eventually('b to see the copy', () =>
      b.node.view.snapshots.get(snap(1))?.value.copies?.length === 1 ? true : null,
    );
    assert.deepEqual(
      (await b.node.placeCreate({ snapshot: snap(1) })).map((x) => x.id),
      ['b', 'a'],
    );
    // Its node down: served from the copy; with no live holder at all, 503 node_unavailable.
    await a.node.stop();
    await eventually('b to see a gone', () => !b.node.view.nodes.has('a'));
    assert.deepEqual(
      (await b.node.placeCreate({ snapshot: snap(1) })).map((x) => x.id),
      ['b'],
    );
    await b.kv.txn([], [{ put: key, value: JSON.stringify(entry) }]);
    await eventually('b to see no copy', () =>
      b.node.view.snapshots.get(snap(1))?.value.copies === undefined ? true : null,
    );
    await assert.rejects(
      b.node.placeCreate({ snapshot: snap(1) }),
      (err) => code(err) === 'node_unavailable',
    );
    // Unknown: this node answers (404).
    assert.deepEqual(
      (await b.node.placeCreate({ snapshot: 'snap_nope' })).map((x) => x.id),
      ['b'],
    );
    await stopAll(b);
  });

  test('a node back with snapshots on disk drops one deleted meanwhile, keeps one of another node as a copy, and drops that when its entry goes', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const records = a.node.snapshotRecords(memoryRecords<SnapshotRecord>());
    records.write({
      id: snap(1),
      source_sandbox_id: sbx(1),
      template: 'python',
      created_at: '2026-01-01T00:00:00.000Z',
      size_bytes: 1,
      name: null,
      state: { format: 1, id: 'st', kind: 'template' } as unknown as SnapshotRecord['state'],
    });
    await records.flush(); // in the catalog once durable, as Snapshots does
    await a.node.confirmSnapshot(snap(1));
    // b comes back holding a copy of a's snapshot, and a snapshot deleted while it was away.
    const b = await join(store, 'b', [], [snap(1), snap(2)]);
    assert.deepEqual(b.local.droppedSnapshots, [snap(2)]);
    const entry = async (): Promise<SnapshotEntry | null> => {
      const e = await a.kv.get(KEYS.snapshot(snap(1)));
      return e ? (JSON.parse(e.value) as SnapshotEntry) : null;
    };
    await eventually('b listed in the copies', async () => (await entry())?.copies?.[0] === 'b');
    assert.equal((await entry())?.node, 'a');
    assert.equal(b.local.snaps.has(snap(1)), true);
    // Deleted through its node: b drops its copy.
    records.remove(snap(1));
    await eventually('b to drop its copy', () => !b.local.snaps.has(snap(1)));
    assert.equal(await entry(), null);
    await stopAll(a, b);
  });

  test('with etcd unreachable, creates are refused (503) and held sandboxes still route', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    const b = await join(store, 'b');
    await createOn(a, sbx(1));
    await eventually('b to see the sandbox', () => b.node.view.live.has(sbx(1)));
    store.down = true;
    assert.throws(
      () => b.node.ensureConnected(),
      (err) => code(err) === 'cluster_unavailable',
    );
    await assert.rejects(b.node.placeCreate({ template: 'python' }), (err) => {
      return code(err) === 'cluster_unavailable';
    });
    const route = await b.node.locateSandbox(sbx(1));
    assert.equal(!route.local && route.node.id, 'a');
    store.down = false;
    await stopAll(a, b);
  });

  test('a create waits for the connection to come back (a member failing over), up to a limit', async () => {
    const store = new MemoryStore();
    const a = await join(store, 'a');
    store.down = true;
    // Not back within the limit: it resolves anyway, and the create is then refused.
    await a.node.awaitConnected(50);
    assert.throws(
      () => a.node.ensureConnected(),
      (err) => code(err) === 'cluster_unavailable',
    );
    // Back meanwhile: it resolves as soon as the watch is connected again.
    const waiting = a.node.awaitConnected(60_000);
    store.down = false;
    await waiting;
    a.node.ensureConnected();
    await stopAll(a);
  });
});
