/**
 * A node's own record (core/cluster/cluster-node.ts publish): its writes go one at a time in the
 * order asked, and each compares with the revision this node last wrote, so that the last
 * intent is what the cluster sees, whatever order the store answers in, and whatever a write
 * whose answer timed out does when it lands late.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import type { KvCompare, KvOp, TxnResult } from '../../src/core/cluster/kv.js';
import { KEYS, type NodeRecord } from '../../src/core/cluster/records.js';
import { eventually } from '../../testkit/eventually.js';
import { MemoryKv, MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });

/**
 * A client whose writes of a node record can be held: `hold()` makes the next one wait (as a
 * slow answer) until released; with `timeOut` its caller is answered with a failure at once
 * (its deadline passed) while the store still applies it once released (as etcd may).
 */
class HeldKv extends MemoryKv {
  /** Set: every write of a node record fails, as with etcd unreachable. */
  failing = false;
  private held: { release: () => void } | null = null;
  /** What the store answered the last held write, once released. */
  applied: Promise<TxnResult> | null = null;
  private armed: { timeOut: boolean } | null = null;
  heldCount = 0;

  hold(timeOut = false): () => void {
    this.armed = { timeOut };
    return () => this.held?.release();
  }

  override async txn(compares: readonly KvCompare[], ops: readonly KvOp[]): Promise<TxnResult> {
    if (this.failing && ops.some((op) => 'put' in op && op.put.startsWith('nodes/'))) {
      throw new Error('etcd unreachable (test)');
    }
    const armed = this.armed;
    if (!armed || !ops.some((op) => 'put' in op && op.put.startsWith('nodes/'))) {
      return super.txn(compares, ops);
    }
    this.armed = null;
    let release!: () => void;
    const open = new Promise<void>((r) => (release = r));
    this.held = { release };
    this.heldCount++;
    const applied = open.then(() => super.txn(compares, ops));
    this.applied = applied;
    if (!armed.timeOut) return applied;
    throw new Error('deadline exceeded (test)');
  }
}

const nodes: ClusterNode[] = [];
after(async () => {
  for (const n of nodes) await n.stop();
});

async function startNode(store: MemoryStore): Promise<{ node: ClusterNode; kv: HeldKv }> {
  const kv = new HeldKv(store);
  const node = new ClusterNode(kv, { id: 'a', url: '', version: '0', ttlS: 10, log });
  nodes.push(node);
  await node.start();
  return { node, kv };
}

const published = (store: MemoryStore): NodeRecord['state'] | undefined =>
  store.read<NodeRecord>(KEYS.node('a'))?.state;

describe("a node's state writes", () => {
  test('a drain and an undrain in flight at once: the later intent is the one published', async () => {
    const store = new MemoryStore();
    const { node, kv } = await startNode(store);
    // The drain's write is slow to be answered; the undrain's comes meanwhile.
    const release = kv.hold();
    const draining = node.setState('draining');
    await eventually('the drain’s write under way', () => kv.heldCount === 1);
    const serving = node.setState('serving');
    release();
    await Promise.all([draining, serving]);
    assert.equal(node.state, 'serving');
    assert.equal(published(store), 'serving');
  });

  test('a write whose answer timed out, applied late, does not overwrite a newer one', async () => {
    const store = new MemoryStore();
    const { node, kv } = await startNode(store);
    const release = kv.hold(true);
    await assert.rejects(node.setState('draining'));
    await node.setState('serving');
    assert.equal(published(store), 'serving');
    // etcd applies the timed-out write now: its compare fails, the newer record stays.
    release();
    assert.equal((await kv.applied)?.succeeded, false);
    assert.equal(published(store), 'serving');
    // And the next write still goes through (its compare is with the node's own last write).
    await node.setState('draining');
    assert.equal(published(store), 'draining');
  });

  test('the periodic publish that joins a forced write waiting never rejects: etcd failing it does not crash hostd', async () => {
    const store = new MemoryStore();
    const { node, kv } = await startNode(store);
    const release = kv.hold();
    const draining = node.setState('draining');
    await eventually('the drain’s write under way', () => kv.heldCount === 1);
    // An undrain waits for its turn; the timer's publish (every PUBLISH_EVERY_MS) joins it.
    const serving = node.setState('serving');
    const periodic = (node as unknown as { publish(force: boolean): Promise<void> }).publish(false);
    kv.failing = true; // etcd unreachable from now on
    release();
    await draining;
    await assert.rejects(serving); // the undrain's caller is told
    // The timer's caller is not (it discards the promise: a rejection would be unhandled, and
    // hostd stops on one, fail-fast.ts).
    await periodic;
  });
});
