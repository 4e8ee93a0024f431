/**
 * A cluster node without VMs: a SandboxManager on the fake hypervisor whose records are mirrored
 * by a ClusterNode on an in-memory store with etcd's semantics (test/helpers/memory-kv.ts). The
 * HTTP-level cluster tests (native and E2B fronts) put their servers in front of it.
 */
import type { Logger } from 'pino';
import { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import type { NodeRecord } from '../../src/core/cluster/records.js';
import { memoryRecords } from '../../src/core/journal.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import type { FakeHypervisor } from './fake-hypervisor.js';
import { setup } from './manager.js';
import type { MemoryStore } from './memory-kv.js';

/**
 * Node `id` of the cluster on `store`, its manager started and its records in the catalog.
 * `overrides` change its manager's options (a node serving other templates, a smaller cap).
 */
export async function startClusterManager(
  store: MemoryStore,
  id: string,
  log: Logger,
  overrides: Partial<ManagerOptions> = {},
): Promise<{ cluster: ClusterNode; manager: SandboxManager; hv: FakeHypervisor }> {
  const cluster = new ClusterNode(store.client(), { id, url: '', version: '0', ttlS: 10, log });
  const { manager, hv } = setup({
    ...overrides,
    // The node's own records under the catalog's mirror: `overrides.records` when a test gives
    // them (a store whose sync fails).
    records: {
      sandboxes: cluster.sandboxRecords(overrides.records?.sandboxes ?? memoryRecords()),
      snapshots: cluster.snapshotRecords(overrides.records?.snapshots ?? memoryRecords()),
    },
    cluster: {
      nodeId: id,
      ensureConnected: () => cluster.ensureConnected(),
      confirmSandboxes: (ids) => cluster.confirmSandboxes(ids),
      confirmSnapshot: (s) => cluster.confirmSnapshot(s),
      fetchSnapshot: (s) => cluster.fetchSnapshot(s),
    },
  });
  cluster.bind({
    holds: (s) => manager.holds(s),
    holdsSnapshot: (s) => manager.holdsSnapshot(s),
    snapshotIds: () => manager.snapshotIds(),
    fence: (s, why) => manager.fence(s, why),
    fenceSnapshot: (s, why) => manager.fenceSnapshot(s, why),
    capacity: () => ({ sandboxes: 10, memory_mib: 8192 }),
    load: () => ({ sandboxes: manager.count, memory_free_mib: 4096 }),
    templates: () =>
      Object.fromEntries(
        manager.listTemplates().map((t) => [t.name, { state: t.state, build: t.image_key }]),
      ),
  });
  await manager.start();
  return { cluster, manager, hv };
}

/**
 * Waits (up to 5 s each) until every node of `clusters` sees all of them in its catalog copy,
 * each record `ready` (the E2B tests also want every node's E2B URL).
 */
export async function untilNodesMeet(
  clusters: readonly ClusterNode[],
  ready: (record: NodeRecord) => boolean = () => true,
): Promise<void> {
  for (const c of clusters) {
    await c.view.waitFor(
      () =>
        c.view.nodes.size === clusters.length && [...c.view.nodes.values()].every(ready)
          ? true
          : null,
      5000,
    );
  }
}
