/**
 * Moving sandboxes between nodes (core/cluster/hand-over.ts, core/cluster/drain.ts): two or three
 * nodes' managers on the fake hypervisor, one in-memory store with etcd's semantics, and peers
 * that call each other directly (test/helpers/in-process-cluster.ts). The bookkeeping a
 * hand-over must get right: the catalog entry goes moving and then the target's, the sandbox
 * keeps its id and its state, the source forgets it without touching the entry, a failed
 * hand-over leaves everything where it was, and a drain empties its node onto the least loaded
 * others.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import type { NodeInfo } from '../../src/core/cluster/cluster-node.js';
import {
  KEYS,
  LEFT_IDS_SHOWN,
  type SandboxEntry,
  type SnapshotEntry,
} from '../../src/core/cluster/records.js';
import type { SandboxManager } from '../../src/core/sandbox-manager.js';
import {
  memoryRecords,
  type RecordStore,
  type SandboxRecord,
  type SnapshotRecord,
} from '../../src/core/journal.js';
import { HostdError, toHostdError } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { startClusterManager, untilNodesMeet } from '../helpers/cluster-manager.js';
import { clustersStoppedAfter, type InProcessNode } from '../helpers/in-process-cluster.js';
import { run } from '../helpers/manager.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });

const stdout = async (manager: SandboxManager, id: string, code: string): Promise<string> =>
  (await run(manager, id, code))
    .filter((e) => e.type === 'stdout')
    .map((e) => e.data)
    .join('\n');

async function snapshotEntry(store: MemoryStore, id: string): Promise<SnapshotEntry | null> {
  const e = await store.client().get(KEYS.snapshot(id));
  return e ? (JSON.parse(e.value) as SnapshotEntry) : null;
}

async function entry(store: MemoryStore, id: string): Promise<SandboxEntry | null> {
  const e = await store.client().get(KEYS.sandbox(id));
  return e ? (JSON.parse(e.value) as SandboxEntry) : null;
}

describe('hand-over of a sandbox to another node', () => {
  const cluster = clustersStoppedAfter();

  test('a running sandbox moves paused under its id, its state intact, and resumes on the target', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 41');
    await a.handOver.moveOut(s.id, b.cluster.selfRecord());
    assert.equal(a.manager.holds(s.id), false);
    assert.equal(b.manager.holds(s.id), true);
    assert.equal(b.manager.describe(s.id).state, 'paused');
    assert.equal(b.manager.describe(s.id).node, 'b');
    assert.deepEqual(
      { node: (await entry(c.store, s.id))?.node, state: (await entry(c.store, s.id))?.state },
      { node: 'b', state: 'paused' },
    );
    assert.equal(await stdout(b.manager, s.id, 'get x'), '41');
    await eventually(
      'the entry running on b',
      async () => (await entry(c.store, s.id))?.state === 'running',
    );
    // The source wrote nothing after the hand-over: the entry is the target's to delete.
    await b.manager.delete(s.id);
    await eventually('the entry gone', async () => (await entry(c.store, s.id)) === null);
  });

  test('a paused sandbox moves as it is, and its pauser is kept', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set y 7');
    await a.manager.pause(s.id);
    await a.handOver.moveOut(s.id, b.cluster.selfRecord());
    const info = b.manager.describe(s.id);
    assert.equal(info.state, 'paused');
    assert.equal(info.paused_by, 'request');
    assert.equal(await stdout(b.manager, s.id, 'get y'), '7');
  });

  test('a hand-over the target refuses leaves the sandbox where it was, its entry its node’s', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 1');
    c.refuse.add('b');
    await assert.rejects(a.handOver.moveOut(s.id, b.cluster.selfRecord()), (err: unknown) => {
      assert.equal(toHostdError(err, 't').code, 'hand_over_failed');
      return true;
    });
    assert.equal(a.manager.holds(s.id), true);
    assert.equal(b.manager.holds(s.id), false);
    assert.equal((await entry(c.store, s.id))?.node, 'a');
    // The node writes its entry again: resumed, it is running there.
    assert.equal(await stdout(a.manager, s.id, 'get x'), '1');
    await eventually(
      'the entry running on a',
      async () => (await entry(c.store, s.id))?.state === 'running',
    );
  });

  test('a target refuses a sandbox whose entry is not moving to it', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    const move = await a.manager.moveOut(s.id, 'b');
    try {
      await assert.rejects(
        b.handOver.moveIn({ from: 'a', record: move.record, manifest: move.manifest }),
        (err: unknown) => toHostdError(err, 't').code === 'cluster_conflict',
      );
      assert.equal(b.manager.holds(s.id), false);
    } finally {
      move.abort();
    }
  });

  test('a drain hands every sandbox to the least loaded other nodes and ends drained', async () => {
    const c = await cluster(['a', 'b', 'c']);
    const [a] = c.at;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const s = await a.manager.create({ template: 'python' });
      await run(a.manager, s.id, `set n ${i}`);
      ids.push(s.id);
    }
    const result = await a.drainer.drain();
    assert.deepEqual(result, { moved: 4, left: 0, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.equal(a.manager.count, 0);
    assert.equal(a.cluster.state, 'drained');
    const where = new Map<string, number>();
    for (const [i, id] of ids.entries()) {
      const holder = ['b', 'c'].find((n) => c.nodes.get(n)!.manager.holds(id));
      assert.ok(holder, id);
      where.set(holder, (where.get(holder) ?? 0) + 1);
      assert.equal(await stdout(c.nodes.get(holder)!.manager, id, 'get n'), String(i));
    }
    assert.deepEqual([...where.values()].sort(), [2, 2]);
    // A drained node takes no creates: placement skips it.
    const order = await c.nodes.get('b')!.cluster.placeCreate({ template: 'python' });
    assert.ok(!order.some((n) => n.id === 'a'));
  });
});

/** Node `id` as `from`'s `GET /v1/cluster` shows it. */
function shown(from: InProcessNode, id: string): NodeInfo | undefined {
  return from.cluster.info().nodes.find((n) => n.id === id);
}

describe('a drain’s report on the node’s record', () => {
  const cluster = clustersStoppedAfter();

  test('a drain shows it runs at once, then ends drained with what it moved, on every node', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    assert.equal(shown(b, 'a')?.drain, null);
    const s = await a.manager.create({ template: 'python' });
    await a.manager.snapshot(s.id);
    const done = a.drainer.drain();
    // What the route's 202 answers: started, not ended, nothing counted as left yet.
    const running = shown(a, 'a');
    assert.equal(running?.state, 'draining');
    assert.equal(running?.drain?.ended_at, null);
    assert.equal(running?.drain?.left, null);
    assert.equal(running?.drain?.snapshots_left, null);
    assert.equal(running?.drain?.left_sandboxes, null);
    assert.equal(running?.drain?.left_snapshots, null);
    assert.deepEqual(await done, { moved: 1, left: 0, snapshotsMoved: 1, snapshotsLeft: 0 });
    const seen = await eventually('b to see a drained', () => {
      const n = shown(b, 'a');
      return n?.state === 'drained' ? n : null;
    });
    assert.ok(seen.drain?.ended_at);
    assert.equal(seen.drain.started_at, running?.drain?.started_at);
    assert.ok(seen.drain.ended_at >= seen.drain.started_at);
    assert.deepEqual(
      { ...seen.drain, started_at: 0, ended_at: 0 },
      {
        started_at: 0,
        ended_at: 0,
        moved: 1,
        left: 0,
        snapshots_moved: 1,
        snapshots_left: 0,
        left_sandboxes: [],
        left_snapshots: [],
        undrained_at: null,
      },
    );
  });

  test('a drain whose hand-overs fail ends with what it left, and the node stays draining', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const one = await a.manager.create({ template: 'python' });
    await run(a.manager, one.id, 'set x 7');
    const two = await a.manager.create({ template: 'python' });
    const snap = await a.manager.snapshot(one.id);
    c.refuse.add('b');
    assert.deepEqual(await a.drainer.drain(), {
      moved: 0,
      left: 2,
      snapshotsMoved: 0,
      snapshotsLeft: 1,
    });
    assert.equal(a.cluster.state, 'draining');
    // Every node tells a client that this drain is over and what it left.
    const seen = await eventually('b to see a’s drain ended', () => {
      const n = shown(b, 'a');
      return n?.drain?.ended_at ? n : null;
    });
    assert.equal(seen.state, 'draining');
    assert.equal(seen.drain?.moved, 0);
    assert.equal(seen.drain?.left, 2);
    assert.equal(seen.drain?.snapshots_moved, 0);
    assert.equal(seen.drain?.snapshots_left, 1);
    // And which: the counts' ids, sorted, for an operator to look at.
    assert.deepEqual(seen.drain?.left_sandboxes, [one.id, two.id].sort());
    assert.deepEqual(seen.drain?.left_snapshots, [snap.snapshot_id]);
    // Still no creates there, and what stayed serves where it is.
    const order = await b.cluster.placeCreate({ template: 'python' });
    assert.ok(!order.some((n) => n.id === 'a'));
    assert.equal(await stdout(a.manager, one.id, 'get x'), '7');
  });

  test('a drain that cannot reach etcd ends at once, saying what it left; the others see it once etcd is back', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    c.store.down = true;
    assert.deepEqual(await a.drainer.drain(), {
      moved: 0,
      left: 1,
      snapshotsMoved: 0,
      snapshotsLeft: 0,
    });
    assert.equal(a.manager.holds(s.id), true);
    const own = shown(a, 'a');
    assert.equal(own?.state, 'draining');
    assert.equal(own?.drain?.left, 1);
    assert.ok(own?.drain?.ended_at);
    c.store.down = false;
    await eventually(
      'b to see a’s drain ended',
      () => shown(b, 'a')?.drain?.ended_at === own.drain?.ended_at,
    );
  });

  test('draining again once the cause is gone is a new round that moves what was left', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 9');
    await a.manager.snapshot(s.id);
    c.refuse.add('b');
    const first = await a.drainer.drain();
    assert.equal(first.left, 1);
    const firstReport = shown(a, 'a')?.drain;
    assert.ok(firstReport?.ended_at);

    c.refuse.delete('b');
    assert.deepEqual(await a.drainer.drain(), {
      moved: 1,
      left: 0,
      snapshotsMoved: 1,
      snapshotsLeft: 0,
    });
    assert.equal(a.cluster.state, 'drained');
    assert.equal(b.manager.holds(s.id), true);
    assert.equal(await stdout(b.manager, s.id, 'get x'), '9');
    const seen = await eventually('b to see a drained', () => {
      const n = shown(b, 'a');
      return n?.state === 'drained' ? n : null;
    });
    // The report is the new round's, not a sum with the first.
    assert.ok(seen.drain && seen.drain.started_at >= firstReport.ended_at);
    assert.equal(seen.drain.moved, 1);
    assert.equal(seen.drain.left, 0);
    assert.equal(seen.drain.snapshots_moved, 1);
    assert.equal(seen.drain.snapshots_left, 0);
  });
});

describe('an undrain', () => {
  const cluster = clustersStoppedAfter();

  /** Whether `b` would place a create on `a` (it takes creates), once b's copy says so. */
  const takesCreates = (b: InProcessNode, a: InProcessNode): Promise<boolean> =>
    eventually(`${b.cluster.id} to place creates on ${a.cluster.id}`, async () =>
      (await b.cluster.placeCreate({ template: 'python' })).some((n) => n.id === a.cluster.id),
    );

  test('returns a node whose drain left something to serving; what stays serves, creates come again', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 3');
    c.refuse.add('b');
    assert.equal((await a.drainer.drain()).left, 1);
    assert.equal(a.cluster.state, 'draining');
    const ended = shown(a, 'a')?.drain;
    await a.drainer.undrain();
    assert.equal(a.cluster.state, 'serving');
    const seen = await eventually('b to see a serving', () => {
      const n = shown(b, 'a');
      return n?.state === 'serving' ? n : null;
    });
    // The report is the same round's, now saying when the undrain came.
    assert.deepEqual({ ...seen.drain, undrained_at: null }, ended);
    assert.ok(seen.drain?.undrained_at && seen.drain.undrained_at >= ended!.ended_at!);
    assert.equal(await takesCreates(b, a), true);
    assert.equal(await stdout(a.manager, s.id, 'get x'), '3');
    const made = await a.manager.create({ template: 'python' });
    assert.equal(a.manager.holds(made.id), true);
  });

  test('returns a drained node to serving; asked again, or of a serving node, it changes nothing', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    // Serving and never drained: nothing to do, no report made.
    await a.drainer.undrain();
    assert.equal(a.cluster.state, 'serving');
    assert.equal(shown(a, 'a')?.drain, null);
    await a.manager.create({ template: 'python' });
    assert.deepEqual(await a.drainer.drain(), {
      moved: 1,
      left: 0,
      snapshotsMoved: 0,
      snapshotsLeft: 0,
    });
    assert.equal(a.cluster.state, 'drained');
    await a.drainer.undrain();
    assert.equal(a.cluster.state, 'serving');
    const once = shown(a, 'a')?.drain;
    assert.ok(once?.undrained_at);
    await a.drainer.undrain();
    assert.deepEqual(shown(a, 'a')?.drain, once);
    assert.equal(await takesCreates(b, a), true);
  });

  test('during a drain, starts no further move; the hand-overs under way finish, and the node serves', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const ids: string[] = [];
    for (const v of [1, 2, 3, 4]) {
      const s = await a.manager.create({ template: 'python' });
      await run(a.manager, s.id, `set x ${v}`);
      ids.push(s.id);
    }
    const release = c.holdOffers();
    const draining = a.drainer.drain();
    // Two hand-overs at once: both are under way, held at their offer.
    await eventually('two offers under way', () => c.offersHeld === 2);
    await a.drainer.undrain();
    assert.equal(a.cluster.state, 'serving');
    release();
    assert.deepEqual(await draining, { moved: 2, left: 2, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.equal(a.cluster.state, 'serving');
    const stayed = ids.filter((id) => a.manager.holds(id));
    const went = ids.filter((id) => b.manager.holds(id));
    assert.equal(stayed.length, 2);
    assert.equal(went.length, 2);
    const report = shown(a, 'a')?.drain;
    assert.ok(report?.ended_at && report.undrained_at);
    assert.deepEqual(
      [report.moved, report.left, report.left_sandboxes],
      [2, 2, [...stayed].sort()],
    );
    for (const id of went)
      assert.equal(await stdout(b.manager, id, 'get x'), String(ids.indexOf(id) + 1));
    assert.equal(await takesCreates(b, a), true);
  });

  test('during a drain, a hand-over under way that fails is not tried again on another node', async () => {
    const c = await cluster(['a', 'b', 'd']);
    const [a, b, d] = c.at;
    const s = await a.manager.create({ template: 'python' });
    const release = c.holdOffers();
    const draining = a.drainer.drain();
    await eventually('its offer under way', () => c.offersHeld === 1);
    // The node it was offered to refuses it; the other would take it.
    const first = c.offered[0]!;
    c.refuse.add(first);
    await a.drainer.undrain();
    release();
    assert.deepEqual(await draining, { moved: 0, left: 1, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.deepEqual(c.offered, [first]);
    assert.equal(a.manager.holds(s.id), true);
    assert.equal(b.manager.holds(s.id) || d.manager.holds(s.id), false);
    assert.equal(a.cluster.state, 'serving');
  });

  /** The undrain's refusal of a node whose hostd stops: the registry's entry, not a message. */
  const refusedAsStopping = (err: unknown): boolean =>
    err instanceof HostdError && err.entry === 'nodeStopping' && err.code === 'cluster_conflict';

  test('of a node whose hostd stops (SIGTERM’s drain) is refused 409; it stays draining and the drain goes on', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await a.manager.create({ template: 'python' })).id);
    const release = c.holdOffers();
    // What main's stop does on SIGTERM: the node leaves, then drains.
    await a.cluster.leave();
    const draining = a.drainer.drain();
    await eventually('two offers under way', () => c.offersHeld === 2);
    await assert.rejects(a.drainer.undrain(), refusedAsStopping);
    assert.equal(a.cluster.state, 'draining');
    assert.equal(shown(a, 'a')?.drain?.undrained_at, null);
    release();
    assert.deepEqual(await draining, { moved: 4, left: 0, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.equal(a.cluster.state, 'drained');
    assert.equal(ids.filter((id) => b.manager.holds(id)).length, 4);
    await eventually('b to see a drained', () => shown(b, 'a')?.state === 'drained');
    // Nor can anything else return it to serving before it is gone.
    await assert.rejects(a.cluster.setState('serving'), refusedAsStopping);
  });

  test('of a node whose hostd stops on SIGINT (no drain) is refused; it is draining at once', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    assert.equal(await takesCreates(b, a), true);
    await a.cluster.leave();
    assert.equal(a.cluster.state, 'draining');
    await assert.rejects(a.drainer.undrain(), refusedAsStopping);
    await eventually('b to see a draining', () => shown(b, 'a')?.state === 'draining');
    assert.equal(
      (await b.cluster.placeCreate({ template: 'python' })).some((n) => n.id === 'a'),
      false,
    );
  });

  test('a drain asked again while an undrained one finishes its moves is a new round, after them', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await a.manager.create({ template: 'python' })).id);
    const release = c.holdOffers();
    const first = a.drainer.drain();
    await eventually('two offers under way', () => c.offersHeld === 2);
    await a.drainer.undrain();
    const second = a.drainer.drain();
    assert.notEqual(second, first);
    assert.equal(a.cluster.state, 'draining');
    const report = shown(a, 'a')?.drain;
    assert.equal(report?.ended_at, null);
    assert.equal(report?.undrained_at, null);
    release();
    assert.equal((await first).moved, 2);
    assert.deepEqual(await second, { moved: 2, left: 0, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.equal(a.cluster.state, 'drained');
    assert.deepEqual(
      ids.filter((id) => b.manager.holds(id)),
      ids,
    );
    // The report is the new round's: the first, replaced, wrote no more.
    const last = shown(a, 'a')?.drain;
    assert.equal(last?.started_at, report?.started_at);
    assert.deepEqual([last?.moved, last?.left, last?.undrained_at], [2, 0, null]);
  });

  test('a drain asked again that cannot start (etcd unreachable) still ends after the undrained one’s moves', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) ids.push((await a.manager.create({ template: 'python' })).id);
    const release = c.holdOffers();
    const first = a.drainer.drain();
    await eventually('two offers under way', () => c.offersHeld === 2);
    await a.drainer.undrain();
    c.store.down = true;
    const second = a.drainer.drain();
    c.store.down = false;
    release();
    assert.equal((await first).moved, 2);
    // Ended before the first round's moves, it would count as left what was still moving (and
    // a third round, not waiting for them, would offer those sandboxes again).
    assert.deepEqual(await second, { moved: 0, left: 0, snapshotsMoved: 0, snapshotsLeft: 0 });
    assert.deepEqual(shown(a, 'a')?.drain?.left_sandboxes, []);
    assert.deepEqual(
      ids.filter((id) => b.manager.holds(id)),
      ids,
    );
  });

  test('a drain report names at most LEFT_IDS_SHOWN ids; its count says how many were left', async () => {
    const many = LEFT_IDS_SHOWN + 2;
    const c = await cluster(['a', 'b'], {}, { a: { maxSandboxes: many } });
    const [a] = c.at;
    for (let i = 0; i < many; i++) await a.manager.create({ template: 'python' });
    c.refuse.add('b');
    assert.equal((await a.drainer.drain()).left, many);
    const report = shown(a, 'a')?.drain;
    assert.equal(report?.left, many);
    const all = a.manager
      .list()
      .map((s) => s.id)
      .sort();
    assert.deepEqual(report?.left_sandboxes, all.slice(0, LEFT_IDS_SHOWN));
  });
});

describe('hand-over of a snapshot to another node', () => {
  const cluster = clustersStoppedAfter();

  test('a snapshot moves under its id and name, its entry the target’s, and restores there', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 5');
    const snap = await a.manager.snapshot(s.id, 'five');
    await a.handOver.moveSnapshotOut(snap.snapshot_id, b.cluster.selfRecord());
    assert.equal(a.manager.holdsSnapshot(snap.snapshot_id), false);
    const there = b.manager.describeSnapshot(snap.snapshot_id);
    assert.deepEqual(
      { name: there.name, created_at: there.created_at, source: there.source_sandbox_id },
      { name: 'five', created_at: snap.created_at, source: s.id },
    );
    const e = await snapshotEntry(c.store, snap.snapshot_id);
    assert.deepEqual({ node: e?.node, name: e?.name }, { node: 'b', name: 'five' });
    assert.equal(a.cluster.snapshotByName('five')?.node, 'b');
    const child = await b.manager.create({ snapshot: snap.snapshot_id });
    assert.equal(await stdout(b.manager, child.id, 'get x'), '5');
    // The source wrote nothing after: the entry is the target's to delete.
    b.manager.deleteSnapshot(snap.snapshot_id);
    await eventually(
      'the entry gone',
      async () => (await snapshotEntry(c.store, snap.snapshot_id)) === null,
    );
  });

  test('a snapshot the target refuses stays, its entry its node’s, and a delete meanwhile waits for none', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    const snap = await a.manager.snapshot(s.id);
    c.refuse.add('b');
    await assert.rejects(
      a.handOver.moveSnapshotOut(snap.snapshot_id, b.cluster.selfRecord()),
      (err: unknown) => toHostdError(err, 't').code === 'hand_over_failed',
    );
    assert.equal(a.manager.holdsSnapshot(snap.snapshot_id), true);
    assert.equal(b.manager.holdsSnapshot(snap.snapshot_id), false);
    assert.equal((await snapshotEntry(c.store, snap.snapshot_id))?.node, 'a');
    // Nothing holds it any more: a delete is served and reaches the catalog.
    a.manager.deleteSnapshot(snap.snapshot_id);
    await eventually(
      'the entry gone',
      async () => (await snapshotEntry(c.store, snap.snapshot_id)) === null,
    );
  });

  test('a snapshot whose record the target cannot sync stays its node’s, in the catalog too', async () => {
    const inner = memoryRecords<SnapshotRecord>();
    const failing: RecordStore<SnapshotRecord> = {
      write: (r) => inner.write(r),
      remove: (id) => inner.remove(id),
      readAll: () => inner.readAll(),
      flush: () => Promise.reject(new Error('EIO')),
    };
    const records = { sandboxes: memoryRecords<SandboxRecord>(), snapshots: failing };
    const c = await cluster(['a', 'b'], {}, { b: { records } });
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    const { snapshot_id: id } = await a.manager.snapshot(s.id);
    await assert.rejects(
      a.handOver.moveSnapshotOut(id, b.cluster.selfRecord()),
      (err: unknown) => toHostdError(err, 't').code === 'hand_over_failed',
    );
    assert.equal(b.manager.holdsSnapshot(id), false);
    assert.equal(a.manager.holdsSnapshot(id), true, 'the source keeps it');
    // Whatever b wrote of it in the catalog is written by now.
    await b.cluster.confirmSnapshot(id).catch(() => undefined);
    assert.equal((await snapshotEntry(c.store, id))?.node, 'a');
    const again = await a.manager.create({ snapshot: id });
    assert.equal(a.manager.describe(again.id).state, 'ready');
  });

  test('a snapshot deleted through another node while it moves is dropped by the target', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    const snap = await a.manager.snapshot(s.id);
    const move = await a.manager.moveSnapshotOut(snap.snapshot_id, 'b');
    try {
      // A delete through the source is refused while it moves.
      assert.throws(
        () => a.manager.deleteSnapshot(snap.snapshot_id),
        (err: unknown) => toHostdError(err, 't').code === 'sandbox_moving',
      );
      const rev = await a.cluster.beginSnapshotMove(snap.snapshot_id);
      // The entry changes (as a delete through another node would): the offer's revision is stale.
      await c.store.client().txn([], [{ delete: KEYS.snapshot(snap.snapshot_id) }]);
      await assert.rejects(
        b.handOver.moveSnapshotIn({ from: 'a', rev, record: move.record, manifest: move.manifest }),
        (err: unknown) => toHostdError(err, 't').code === 'cluster_conflict',
      );
      assert.equal(b.manager.holdsSnapshot(snap.snapshot_id), false);
    } finally {
      move.abort();
    }
  });

  test('a drain moves snapshots after sandboxes, to where the sandboxes made from them went, copying the state once', async () => {
    const c = await cluster(['a', 'b', 'c']);
    const [a] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set k 9');
    const snap = await a.manager.snapshot(s.id, 'nine');
    await a.manager.delete(s.id);
    const child = await a.manager.create({ snapshot: snap.snapshot_id });
    const lone = await a.manager.snapshot(child.id);
    const result = await a.drainer.drain();
    assert.deepEqual(result, { moved: 1, left: 0, snapshotsMoved: 2, snapshotsLeft: 0 });
    assert.equal(a.cluster.state, 'drained');
    const holder = ['b', 'c'].find((n) => c.nodes.get(n)!.manager.holds(child.id))!;
    const h = c.nodes.get(holder)!;
    assert.equal(h.manager.holdsSnapshot(snap.snapshot_id), true);
    // Its frozen state came with the child's hand-over and was not fetched again.
    assert.ok(!h.hv.fetched.some((p) => p.startsWith('images/')), h.hv.fetched.join(', '));
    const again = await h.manager.create({ snapshot: snap.snapshot_id });
    assert.equal(await stdout(h.manager, again.id, 'get k'), '9');
    const loneAt = ['b', 'c'].find((n) => c.nodes.get(n)!.manager.holdsSnapshot(lone.snapshot_id));
    assert.ok(loneAt);
    assert.equal((await snapshotEntry(c.store, lone.snapshot_id))?.node, loneAt);
  });

  test('a drain moves a snapshot whose files were still syncing when its sandbox moved', async () => {
    const c = await cluster(['a', 'b']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    a.hv.hold('persist');
    // Captured, then synced with the sandbox's turn released: the drain can move the sandbox.
    const snap = a.manager.snapshot(s.id);
    await eventually('the snapshot to sync its files', () => a.hv.waitingAt('persist') === 1);
    const done = a.drainer.drain();
    await eventually('the sandbox moved', () => shown(a, 'a')?.drain?.moved === 1);
    a.hv.release('persist');
    const { snapshot_id: id } = await snap;
    assert.deepEqual(await done, { moved: 1, left: 0, snapshotsMoved: 1, snapshotsLeft: 0 });
    assert.equal(a.cluster.state, 'drained');
    assert.equal(b.manager.holdsSnapshot(id), true);
    assert.equal((await snapshotEntry(c.store, id))?.node, 'b');
  });

  test('a drain leaves a snapshot another live node holds a copy of to that node, copying nothing', async () => {
    const c = await cluster(['a', 'b', 'c']);
    const [a, b] = c.at;
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set k 3');
    const snap = await a.manager.snapshot(s.id, 'three');
    await a.manager.delete(s.id);
    // A create from it placed on b copies it there.
    const child = await b.manager.create({ snapshot: snap.snapshot_id });
    assert.equal(await stdout(b.manager, child.id, 'get k'), '3');
    assert.deepEqual((await snapshotEntry(c.store, snap.snapshot_id))?.copies, ['b']);
    await eventually('a to see the copy', () =>
      a.cluster.view.snapshots.get(snap.snapshot_id)?.value.copies?.includes('b') ? true : null,
    );
    const fetchedBefore = [...c.nodes.values()].map((n) => n.hv.fetched.length);
    const result = await a.drainer.drain();
    assert.deepEqual(result, { moved: 0, left: 0, snapshotsMoved: 1, snapshotsLeft: 0 });
    assert.equal(a.manager.holdsSnapshot(snap.snapshot_id), false);
    assert.deepEqual(
      [...c.nodes.values()].map((n) => n.hv.fetched.length),
      fetchedBefore,
      'nothing copied',
    );
    const e = await snapshotEntry(c.store, snap.snapshot_id);
    assert.deepEqual(
      { node: e?.node, copies: e?.copies ?? [], name: e?.name },
      {
        node: 'b',
        copies: [],
        name: 'three',
      },
    );
    // b's now: its delete removes the entry.
    await b.manager.delete(child.id);
    b.manager.deleteSnapshot(snap.snapshot_id);
    await eventually(
      'the entry gone',
      async () => (await snapshotEntry(c.store, snap.snapshot_id)) === null,
    );
  });
});

describe('a node gone for good', () => {
  test('forgetting it removes the entries of its sandboxes and snapshots, and only those', async () => {
    const store = new MemoryStore();
    const a = await startClusterManager(store, 'a', log);
    const b = await startClusterManager(store, 'b', log);
    for (const n of [a, b]) {
      n.cluster.url = `http://${n.cluster.id}`;
      await n.cluster.start();
    }
    await untilNodesMeet([a.cluster, b.cluster], (r) => r.templates.python?.state === 'ready');
    try {
      const s = await b.manager.create({ template: 'python' });
      const snap = await b.manager.snapshot(s.id);
      await b.manager.pause(s.id);
      const kept = await a.manager.create({ template: 'python' });
      await b.cluster.writer.settle(5000);
      // b stops answering for the cluster (its lease goes); its entries stay.
      await b.cluster.stop();
      await eventually('a to see b gone', () => !a.cluster.view.nodes.has('b'));
      await assert.rejects(
        a.cluster.locateSandbox(s.id),
        (err: unknown) => toHostdError(err, 't').code === 'node_unavailable',
      );
      assert.deepEqual(await a.cluster.forgetNode('b'), { sandboxes: 1, snapshots: 1 });
      assert.equal(await entry(store, s.id), null);
      assert.equal(await snapshotEntry(store, snap.snapshot_id), null);
      assert.equal((await entry(store, kept.id))?.node, 'a');
      await eventually('a to know neither', () => !a.cluster.view.sandboxes.has(s.id));
      assert.deepEqual(await a.cluster.locateSandbox(s.id), { local: true }); // answered: 404
      // Forgetting it again: the catalog names no such node any more.
      await assert.rejects(
        a.cluster.forgetNode('b'),
        (err: unknown) => toHostdError(err, 't').code === 'node_not_found',
      );
      // A live node is not forgotten.
      await assert.rejects(
        a.cluster.forgetNode('a'),
        (err: unknown) => toHostdError(err, 't').code === 'cluster_conflict',
      );
    } finally {
      for (const n of [a, b]) {
        await n.manager.shutdown();
        await n.cluster.stop().catch(() => undefined);
      }
    }
  });
});

describe('hand-over between nodes whose template builds differ', () => {
  const cluster = clustersStoppedAfter();

  test('sandboxes and a snapshot move onto the source’s build, copied once; the target’s creates keep its own', async () => {
    const c = await cluster(['a', 'b'], { b: '-rebuilt' });
    const [a, b] = c.at;
    assert.equal(a.manager.describeTemplate('python').image_key, 'key-python');
    assert.equal(b.manager.describeTemplate('python').image_key, 'key-python-rebuilt');
    const s1 = await a.manager.create({ template: 'python' });
    await run(a.manager, s1.id, 'set x 41');
    const s2 = await a.manager.create({ template: 'python' });
    await run(a.manager, s2.id, 'set y 7');
    const snap = await a.manager.snapshot(s2.id, 'seven');
    await a.handOver.moveOut(s1.id, b.cluster.selfRecord());
    await a.handOver.moveOut(s2.id, b.cluster.selfRecord());
    await a.handOver.moveSnapshotOut(snap.snapshot_id, b.cluster.selfRecord());
    // The build came once, before the first sandbox's files; the others found it by key.
    assert.deepEqual(b.hv.copiedBuilds, ['key-python']);
    assert.equal(b.hv.fetched.filter((p) => p.startsWith('cache/')).length, 1);
    assert.equal(await stdout(b.manager, s1.id, 'get x'), '41');
    assert.equal(await stdout(b.manager, s2.id, 'get y'), '7');
    const child = await b.manager.create({ snapshot: snap.snapshot_id });
    assert.equal(await stdout(b.manager, child.id, 'get y'), '7');
    // What came from a runs on a's build; a create of b's own runs on b's.
    const fresh = await b.manager.create({ template: 'python' });
    await run(b.manager, fresh.id, 'set z 1');
    const builds = (key: string): number => b.hv.live.filter((m) => m.origin.build === key).length;
    assert.equal(builds('key-python'), 3);
    assert.ok(builds('key-python-rebuilt') >= 1);
    assert.ok(
      b.hv.live.some((m) => m.memory.get('z') === '1' && m.origin.build === 'key-python-rebuilt'),
    );
  });
});

describe('a node without room for a copy refuses it before fetching anything', () => {
  const cluster = clustersStoppedAfter();

  /** Asserts `p` rejects with 503 insufficient_resources (or a hand-over failing for it). */
  const refusedForRoom = async (p: Promise<unknown>, words: RegExp): Promise<void> => {
    await assert.rejects(p, (err: unknown) => {
      const e = toHostdError(err, 't');
      assert.ok(
        e.code === 'insufficient_resources' || e.code === 'hand_over_failed',
        `${e.code}: ${e.message}`,
      );
      assert.equal(e.status, 503);
      assert.match(e.message, words);
      return true;
    });
  };

  test('a hand-over to a node at its storage cap is refused there; the sandbox stays', async () => {
    // b holds a paused sandbox: 1 MiB of storage is all it may take.
    const c = await cluster(['a', 'b'], {}, { b: { maxStorageMib: 1 } });
    const [a, b] = c.at;
    const there = await b.manager.create({ template: 'python' });
    await b.manager.pause(there.id);
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 5');
    await refusedForRoom(
      a.handOver.moveOut(s.id, b.cluster.selfRecord()),
      /SERVICE_MAX_STORAGE_MIB/,
    );
    assert.deepEqual(b.hv.fetched, []);
    assert.equal(b.manager.holds(s.id), false);
    assert.equal((await entry(c.store, s.id))?.node, 'a');
    assert.equal(await stdout(a.manager, s.id, 'get x'), '5');
  });

  test("a snapshot's hand-over and a snapshot's copy to a node at its cap are refused there", async () => {
    const c = await cluster(['a', 'b'], {}, { b: { maxStorageMib: 1 } });
    const [a, b] = c.at;
    const there = await b.manager.create({ template: 'python' });
    await b.manager.pause(there.id);
    const s = await a.manager.create({ template: 'python' });
    await run(a.manager, s.id, 'set x 6');
    const snap = await a.manager.snapshot(s.id);
    await eventually('b to see the snapshot', () => b.cluster.view.snapshots.has(snap.snapshot_id));
    await refusedForRoom(
      a.handOver.moveSnapshotOut(snap.snapshot_id, b.cluster.selfRecord()),
      /SERVICE_MAX_STORAGE_MIB/,
    );
    // A create from it placed on b: 503, so that the placement asks the next node.
    await assert.rejects(b.manager.create({ snapshot: snap.snapshot_id }), (err: unknown) => {
      const e = toHostdError(err, 't');
      assert.deepEqual([e.code, e.status], ['insufficient_resources', 503], e.message);
      assert.match(e.message, /SERVICE_MAX_STORAGE_MIB/);
      return true;
    });
    assert.deepEqual(b.hv.fetched, []);
    assert.equal(b.manager.holdsSnapshot(snap.snapshot_id), false);
    assert.equal((await snapshotEntry(c.store, snap.snapshot_id))?.node, 'a');
    assert.deepEqual((await snapshotEntry(c.store, snap.snapshot_id))?.copies ?? [], []);
  });

  test('a drain passes over a node whose disk has no room for the copies, to one that has', async () => {
    // b's data directory is nearly full: 10 MiB free, the 256 MiB reserve not left.
    const c = await cluster(
      ['a', 'b', 'c'],
      {},
      {
        b: {
          minFreeMib: 256,
          hostFree: () => ({ memAvailableMib: 1 << 20, dataDirFreeMib: 10 }),
        },
      },
    );
    const [a, b, third] = c.at;
    const ids: string[] = [];
    for (const v of [1, 2, 3]) {
      const s = await a.manager.create({ template: 'python' });
      await run(a.manager, s.id, `set x ${v}`);
      ids.push(s.id);
    }
    await a.drainer.drain();
    assert.deepEqual(b.hv.fetched, []);
    for (const [i, id] of ids.entries()) {
      assert.equal(third.manager.holds(id), true, `${id} on c`);
      assert.equal(await stdout(third.manager, id, 'get x'), String(i + 1));
    }
  });
});
