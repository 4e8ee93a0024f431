/**
 * The catalog in cluster mode (core/cluster/): placement, this node's copy of the catalog, and
 * the writer that keeps this node's entries equal to what it holds, by compare-and-set, through
 * etcd outages and against other nodes' changes. Against an in-memory store with etcd's
 * semantics (test/helpers/memory-kv.ts).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { CatalogView } from '../../src/core/cluster/catalog-view.js';
import { CatalogWriter } from '../../src/core/cluster/catalog-writer.js';
import { placementOrder } from '../../src/core/cluster/placement.js';
import type { NodeRecord, SandboxEntry } from '../../src/core/cluster/records.js';
import { isError } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { MemoryStore } from '../helpers/memory-kv.js';

function node(id: string, over: Partial<NodeRecord> = {}): NodeRecord {
  return {
    id,
    url: `http://${id}`,
    state: 'serving',
    version: '0',
    started_at: '2026-01-01T00:00:00Z',
    capacity: { sandboxes: 10, memory_mib: 8192 },
    load: { sandboxes: 0, memory_free_mib: 8000 },
    templates: { python: { state: 'ready', build: 'b1' } },
    ...over,
  };
}

/**
 * How long a test lets a write it confirms take: the store is in memory, so only a stalled host
 * comes near it. A test that expects a refusal gets it at once (a conflict) or asks for its own
 * short bound (the store down).
 */
const CONFIRM_MS = 30_000;

const entry = (nodeId: string, state: SandboxEntry['state'] = 'running'): SandboxEntry => ({
  node: nodeId,
  state,
  template: 'python',
  parent: null,
  snapshot: null,
  created_at: '2026-01-01T00:00:00Z',
});

describe('placement', () => {
  const running = (counts: Record<string, number>) => (id: string) => counts[id] ?? 0;

  test('the least loaded node against its capacity comes first, the others follow', () => {
    const nodes = [
      node('a', { capacity: { sandboxes: 10, memory_mib: 1 } }),
      node('b', { capacity: { sandboxes: 100, memory_mib: 1 } }),
      node('c', { capacity: { sandboxes: 10, memory_mib: 1 } }),
    ];
    // b runs the most sandboxes but is the least full.
    const order = placementOrder(
      { nodes, running: running({ a: 5, b: 20, c: 3 }) },
      { template: 'python' },
    );
    assert.deepEqual(order, ['b', 'c', 'a']);
  });

  test('only serving nodes whose template is ready are candidates', () => {
    const nodes = [
      node('a', { state: 'draining' }),
      node('b', { templates: { python: { state: 'building', build: null } } }),
      node('c', { templates: {} }),
      node('d'),
    ];
    assert.deepEqual(placementOrder({ nodes, running: () => 0 }, { template: 'python' }), ['d']);
    assert.deepEqual(placementOrder({ nodes, running: () => 0 }, { template: 'slim' }), []);
  });

  test('on equal load the receiving node wins (no hop)', () => {
    const nodes = [node('a'), node('b'), node('c')];
    for (let i = 0; i < 20; i++) {
      const r = () => Math.random();
      assert.equal(
        placementOrder(
          { nodes, running: () => 1, random: r },
          { template: 'python', self: 'b' },
        )[0],
        'b',
      );
    }
  });

  test('a node short of memory goes after every other', () => {
    const nodes = [node('a', { load: { sandboxes: 0, memory_free_mib: 100 } }), node('b')];
    const order = placementOrder(
      { nodes, running: running({ a: 0, b: 9 }), lowMemoryMib: 512 },
      { template: 'python' },
    );
    assert.deepEqual(order, ['b', 'a']);
  });

  test('sequential placements that count what they placed spread over every node', () => {
    const nodes = [node('a'), node('b'), node('c')];
    const counts: Record<string, number> = {};
    for (let i = 0; i < 6; i++) {
      const first = placementOrder({ nodes, running: running(counts) }, { template: 'python' })[0]!;
      counts[first] = (counts[first] ?? 0) + 1;
    }
    assert.deepEqual(counts, { a: 2, b: 2, c: 2 });
  });
});

describe('catalog view', () => {
  test('reads the catalog, then follows every change', async () => {
    const store = new MemoryStore();
    const kv = store.client();
    await kv.grantLease(10, () => undefined);
    await kv.txn([], [{ put: 'nodes/a', value: JSON.stringify(node('a')), lease: true }]);
    const view = new CatalogView(store.client());
    await view.start();
    assert.deepEqual([...view.nodes.keys()], ['a']);
    await kv.txn(
      [],
      [
        { put: 'sandboxes/sbx_1', value: JSON.stringify(entry('a')) },
        { put: 'live/sbx_1', value: 'a', lease: true },
      ],
    );
    assert.equal(view.sandboxes.get('sbx_1')?.value.node, 'a');
    assert.equal(view.liveCount('a'), 1);
    kv.expire();
    assert.equal(view.nodes.size, 0);
    assert.equal(view.live.size, 0, 'live keys go with the lease');
    assert.equal(view.sandboxes.size, 1, 'entries stay: the sandbox is lost, not unknown');
  });

  test('a lookup this copy misses asks the store; the store unreachable is an error', async () => {
    const store = new MemoryStore();
    const view = new CatalogView(store.client());
    await view.start();
    view.stop(); // as if the watch lagged behind
    await store.client().txn([], [{ put: 'sandboxes/sbx_2', value: JSON.stringify(entry('b')) }]);
    assert.equal((await view.lookup('sbx_2'))?.value.node, 'b');
    assert.equal(await view.lookup('sbx_3'), null);
    store.down = true;
    await assert.rejects(view.lookup('sbx_3'));
  });

  test('waitFor resolves on the change it waits for, or null at its deadline', async () => {
    const store = new MemoryStore();
    const view = new CatalogView(store.client());
    await view.start();
    const moved = view.waitFor(() => view.sandboxes.get('sbx_4')?.value.node ?? null, 5000);
    await store.client().txn([], [{ put: 'sandboxes/sbx_4', value: JSON.stringify(entry('c')) }]);
    assert.equal(await moved, 'c');
    assert.equal(await view.waitFor(() => null, 1), null);
  });
});

describe('catalog writer', () => {
  function setup(nodeId = 'a') {
    const store = new MemoryStore();
    const kv = store.client();
    const conflicts: { id: string; current: unknown }[] = [];
    const writer = new CatalogWriter(kv, {
      node: nodeId,
      onConflict: (_kind, id, current) => conflicts.push({ id, current }),
      maxBackoffMs: 5,
    });
    return { store, kv, writer, conflicts };
  }

  test('a new sandbox is written with its live key on the lease; confirm waits for it', async () => {
    const { store, kv, writer } = setup();
    await kv.grantLease(10, () => undefined);
    writer.start();
    writer.setSandbox('sbx_1', entry('a'), true, 0);
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_1')?.state, 'running');
    assert.equal(store.keys.get('live/sbx_1')?.lease, kv.lease);
    writer.setSandbox('sbx_1', entry('a', 'paused'), false, 0);
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_1')?.state, 'paused');
    assert.equal(store.keys.has('live/sbx_1'), false, 'a paused sandbox has no live key');
    writer.setSandbox('sbx_1', null, false, 0);
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    assert.equal(store.keys.has('sandboxes/sbx_1'), false);
  });

  test('writes made while etcd is down are applied when it is back, latest first', async () => {
    const { store, kv, writer } = setup();
    await kv.grantLease(10, () => undefined);
    writer.start();
    writer.setSandbox('sbx_1', entry('a'), true, 0);
    writer.setSandbox('sbx_2', entry('a'), true, 0);
    await writer.confirm(
      [
        { kind: 'sandbox', id: 'sbx_1' },
        { kind: 'sandbox', id: 'sbx_2' },
      ],
      CONFIRM_MS,
    );
    store.down = true;
    writer.setSandbox('sbx_1', entry('a', 'paused'), false, 0);
    writer.setSandbox('sbx_2', null, false, 0);
    await assert.rejects(writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], 30), (err) =>
      isError(err, 'clusterUnavailable'),
    );
    assert.equal(writer.backlog, 2);
    store.down = false;
    await eventually('the backlog to be written', () => writer.backlog === 0);
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_1')?.state, 'paused');
    assert.equal(store.keys.has('sandboxes/sbx_2'), false);
  });

  test('an entry another node took (a hand-over) or removed (a delete) is a conflict: nothing is written', async () => {
    const { store, kv, writer, conflicts } = setup();
    await kv.grantLease(10, () => undefined);
    writer.start();
    writer.setSandbox('sbx_1', entry('a'), true, 0);
    writer.setSandbox('sbx_2', entry('a'), true, 0);
    await writer.confirm(
      [
        { kind: 'sandbox', id: 'sbx_1' },
        { kind: 'sandbox', id: 'sbx_2' },
      ],
      CONFIRM_MS,
    );
    const other = store.client();
    await other.txn([], [{ put: 'sandboxes/sbx_1', value: JSON.stringify(entry('b')) }]);
    await other.txn([], [{ delete: 'sandboxes/sbx_2' }]);
    writer.setSandbox('sbx_1', entry('a', 'paused'), false, 0);
    writer.setSandbox('sbx_2', entry('a', 'paused'), false, 0);
    await eventually('both conflicts', () => conflicts.length === 2);
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_1')?.node, 'b');
    assert.equal(store.keys.has('sandboxes/sbx_2'), false);
    assert.deepEqual(conflicts.map((c) => c.id).sort(), ['sbx_1', 'sbx_2']);
  });

  test('after a restart, entries still ours are adopted at their revision; others are conflicts', async () => {
    const store = new MemoryStore();
    const before = store.client();
    await before.grantLease(10, () => undefined);
    await before.txn(
      [],
      [
        { put: 'sandboxes/sbx_1', value: JSON.stringify(entry('a')) },
        { put: 'sandboxes/sbx_2', value: JSON.stringify(entry('b')) },
      ],
    );
    before.expire(); // the node died
    const conflicts: string[] = [];
    const kv = store.client();
    const writer = new CatalogWriter(kv, {
      node: 'a',
      onConflict: (_k, id) => conflicts.push(id),
    });
    await kv.grantLease(10, () => undefined);
    writer.setSandbox('sbx_1', entry('a'), true, 'adopt');
    writer.setSandbox('sbx_2', entry('a'), true, 'adopt');
    writer.setSandbox('sbx_3', entry('a'), true, 'adopt'); // deleted while it was down
    writer.start();
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    await eventually('the conflicts', () => conflicts.length === 2);
    assert.equal(store.keys.get('live/sbx_1')?.value, 'a');
    assert.deepEqual(conflicts.sort(), ['sbx_2', 'sbx_3']);
  });

  test('a new lease gets every live key written again', async () => {
    const { store, kv, writer } = setup();
    await kv.grantLease(10, () => undefined);
    writer.start();
    writer.setSandbox('sbx_1', entry('a'), true, 0);
    writer.setSandbox('sbx_2', entry('a', 'paused'), false, 0);
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    kv.expire();
    assert.equal(store.keys.has('live/sbx_1'), false);
    await kv.grantLease(10, () => undefined);
    writer.relive();
    await eventually('the live key back', () => store.keys.has('live/sbx_1'));
    assert.equal(store.keys.has('live/sbx_2'), false);
  });

  test('a hand-over target commits by comparing with the moving entry; a changed entry fails it', async () => {
    const { store, kv, writer, conflicts } = setup('b');
    await kv.grantLease(10, () => undefined);
    writer.start();
    const source = store.client();
    const moving = await source.txn(
      [],
      [{ put: 'sandboxes/sbx_1', value: JSON.stringify({ ...entry('a', 'moving'), to: 'b' }) }],
    );
    writer.setSandbox('sbx_1', entry('b', 'paused'), false, moving.revision);
    await writer.confirm([{ kind: 'sandbox', id: 'sbx_1' }], CONFIRM_MS);
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_1')?.node, 'b');

    await source.txn(
      [],
      [{ put: 'sandboxes/sbx_2', value: JSON.stringify({ ...entry('a', 'moving'), to: 'b' }) }],
    );
    const stale = store.revision;
    // The source gave up and took it back before the target committed.
    await source.txn([], [{ put: 'sandboxes/sbx_2', value: JSON.stringify(entry('a', 'paused')) }]);
    writer.setSandbox('sbx_2', entry('b', 'paused'), false, stale);
    await assert.rejects(writer.confirm([{ kind: 'sandbox', id: 'sbx_2' }], CONFIRM_MS), (err) =>
      isError(err, 'clusterConflict'),
    );
    assert.deepEqual(
      conflicts.map((c) => c.id),
      ['sbx_2'],
    );
    assert.equal(store.read<SandboxEntry>('sandboxes/sbx_2')?.node, 'a');
  });
});
