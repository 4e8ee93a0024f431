/**
 * Moving sandboxes between nodes (core/cluster/hand-over.ts, core/cluster/drain.ts): two or three
 * nodes' managers on the fake hypervisor, one in-memory store with etcd's semantics, and peers
 * that call each other directly. The bookkeeping a hand-over must get right: the catalog entry
 * goes moving and then the target's, the sandbox keeps its id and its state, the source forgets
 * it without touching the entry, a failed hand-over leaves everything where it was, and a drain
 * empties its node onto the least loaded others.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import type { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import { Drainer } from '../../src/core/cluster/drain.js';
import { HandOver, type HandOverOffer, type PeerLink } from '../../src/core/cluster/hand-over.js';
import { KEYS, type SandboxEntry } from '../../src/core/cluster/records.js';
import type { SandboxManager } from '../../src/core/sandbox-manager.js';
import { fail, toHostdError } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { startClusterManager, untilNodesMeet } from '../helpers/cluster-manager.js';
import { run } from '../helpers/manager.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });

interface Node {
  cluster: ClusterNode;
  manager: SandboxManager;
  handOver: HandOver;
  drainer: Drainer;
}

const stdout = async (manager: SandboxManager, id: string, code: string): Promise<string> =>
  (await run(manager, id, code))
    .filter((e) => e.type === 'stdout')
    .map((e) => e.data)
    .join('\n');

/** Peers that call each other in-process; `refuse` makes a node reject every offer. */
function peers(nodes: Map<string, Node>, refuse: Set<string>): PeerLink {
  return {
    fetchFile: async (from, file, offset) =>
      (await nodes.get(from.id)!.manager.readExported(file.path, offset))
        .stream as AsyncIterable<Uint8Array>,
    offer: async (to, offer) => {
      if (refuse.has(to.id)) throw fail('nodeUnreachable', to.id, 'connection refused');
      // Through JSON, as over HTTP.
      return nodes.get(to.id)!.handOver.moveIn(JSON.parse(JSON.stringify(offer)) as HandOverOffer);
    },
  };
}

async function cluster(ids: string[]): Promise<{
  nodes: Map<string, Node>;
  store: MemoryStore;
  refuse: Set<string>;
  stop(): Promise<void>;
}> {
  const store = new MemoryStore();
  const nodes = new Map<string, Node>();
  const refuse = new Set<string>();
  const link = peers(nodes, refuse);
  for (const id of ids) {
    const { cluster: c, manager } = await startClusterManager(store, id, log);
    c.url = `http://${id}`;
    await c.start();
    const handOver = new HandOver(c, manager, link, log);
    nodes.set(id, {
      cluster: c,
      manager,
      handOver,
      drainer: new Drainer(c, manager, handOver, log),
    });
  }
  await untilNodesMeet(
    [...nodes.values()].map((n) => n.cluster),
    (r) => r.templates.python?.state === 'ready',
  );
  return {
    nodes,
    store,
    refuse,
    stop: async () => {
      for (const n of nodes.values()) {
        await n.manager.shutdown();
        await n.cluster.stop();
      }
    },
  };
}

async function entry(store: MemoryStore, id: string): Promise<SandboxEntry | null> {
  const e = await store.client().get(KEYS.sandbox(id));
  return e ? (JSON.parse(e.value) as SandboxEntry) : null;
}

describe('hand-over of a sandbox to another node', () => {
  const stops: (() => Promise<void>)[] = [];
  after(async () => {
    for (const s of stops) await s();
  });

  test('a running sandbox moves paused under its id, its state intact, and resumes on the target', async () => {
    const c = await cluster(['a', 'b']);
    stops.push(c.stop);
    const a = c.nodes.get('a')!;
    const b = c.nodes.get('b')!;
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
    stops.push(c.stop);
    const a = c.nodes.get('a')!;
    const b = c.nodes.get('b')!;
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
    stops.push(c.stop);
    const a = c.nodes.get('a')!;
    const b = c.nodes.get('b')!;
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
    stops.push(c.stop);
    const a = c.nodes.get('a')!;
    const b = c.nodes.get('b')!;
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
    stops.push(c.stop);
    const a = c.nodes.get('a')!;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const s = await a.manager.create({ template: 'python' });
      await run(a.manager, s.id, `set n ${i}`);
      ids.push(s.id);
    }
    const result = await a.drainer.drain();
    assert.deepEqual(result, { moved: 4, left: 0 });
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
