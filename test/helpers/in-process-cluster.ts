/**
 * Nodes of one cluster in one process, for the tests of moves between nodes (hand-overs, drains,
 * undrains): each a SandboxManager on the fake hypervisor with its ClusterNode, HandOver and
 * Drainer, all on one in-memory store with etcd's semantics, and peers that call each other
 * directly (offers through JSON, as over HTTP). The same over real HTTP is in
 * test/unit/cluster-peer-http.test.ts.
 */
import { after } from 'node:test';
import { pino } from 'pino';
import type { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import { Drainer } from '../../src/core/cluster/drain.js';
import {
  HandOver,
  type HandOverOffer,
  type PeerLink,
  type SnapshotExport,
  type SnapshotOffer,
} from '../../src/core/cluster/hand-over.js';
import { SnapshotCopies } from '../../src/core/cluster/snapshot-copies.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import { fail } from '../../src/errors.js';
import { startClusterManager, untilNodesMeet } from './cluster-manager.js';
import type { FakeHypervisor } from './fake-hypervisor.js';
import { FakeImages } from './fake-images.js';
import { MemoryStore } from './memory-kv.js';

const log = pino({ level: 'silent' });

export interface InProcessNode {
  cluster: ClusterNode;
  hv: FakeHypervisor;
  manager: SandboxManager;
  handOver: HandOver;
  drainer: Drainer;
}

export interface InProcessCluster<T extends readonly string[]> {
  nodes: Map<string, InProcessNode>;
  /** The nodes in the order their ids were given: `const [a, b] = c.at`. */
  at: { [K in keyof T]: InProcessNode };
  store: MemoryStore;
  /** Node ids that reject every offer (as a peer refusing the connection). */
  refuse: Set<string>;
  /**
   * Holds every sandbox offer made from now on until the returned function is called (a
   * hand-over under way, for what happens meanwhile); `offersHeld` counts those waiting.
   */
  holdOffers(): () => void;
  readonly offersHeld: number;
  /** The node each sandbox offer was made to, in the order they were made (held ones too). */
  offered: string[];
  stop(): Promise<void>;
}

/** Offers wait here while held. */
class Gate {
  private open: Promise<void> | null = null;
  waiting = 0;

  hold(): () => void {
    let release!: () => void;
    this.open = new Promise((resolve) => (release = resolve));
    return () => {
      this.open = null;
      release();
    };
  }

  async pass(): Promise<void> {
    if (!this.open) return;
    this.waiting++;
    try {
      await this.open;
    } finally {
      this.waiting--;
    }
  }
}

/**
 * Peers that call each other in-process; `refuse` makes a node reject every offer, `gate` holds
 * sandbox offers.
 */
function peers(
  nodes: Map<string, InProcessNode>,
  refuse: Set<string>,
  gate: Gate,
  offered: string[],
): PeerLink {
  return {
    fetchFile: async (from, file, offset) =>
      (await nodes.get(from.id)!.manager.readExported(file.path, offset))
        .stream as AsyncIterable<Uint8Array>,
    offer: async (to, offer) => {
      offered.push(to.id);
      await gate.pass();
      if (refuse.has(to.id)) throw fail('nodeUnreachable', to.id, 'connection refused');
      // Through JSON, as over HTTP.
      return nodes.get(to.id)!.handOver.moveIn(JSON.parse(JSON.stringify(offer)) as HandOverOffer);
    },
    offerSnapshot: async (to, offer) => {
      if (refuse.has(to.id)) throw fail('nodeUnreachable', to.id, 'connection refused');
      return nodes
        .get(to.id)!
        .handOver.moveSnapshotIn(JSON.parse(JSON.stringify(offer)) as SnapshotOffer);
    },
    exportSnapshot: async (from, id) =>
      JSON.parse(
        JSON.stringify(await nodes.get(from.id)!.manager.exportSnapshot(id)),
      ) as SnapshotExport,
  };
}

/**
 * Nodes `ids` on one store, each seeing all the others with `python` ready; `variants` gives a
 * node's image cache builds of its own (other keys), as a node built at another time or from
 * another version has; `overrides` change a node's manager options.
 */
export async function inProcessCluster<const T extends readonly string[]>(
  ids: T,
  variants: Record<string, string> = {},
  overrides: Record<string, Partial<ManagerOptions>> = {},
): Promise<InProcessCluster<T>> {
  const store = new MemoryStore();
  const nodes = new Map<string, InProcessNode>();
  const refuse = new Set<string>();
  const gate = new Gate();
  const offered: string[] = [];
  const link = peers(nodes, refuse, gate, offered);
  const stop = async (): Promise<void> => {
    // Every node, though one fails to stop; the first failure is thrown after.
    const failures: unknown[] = [];
    for (const n of nodes.values()) {
      await n.manager.shutdown().catch((err: unknown) => failures.push(err));
      await n.cluster.stop().catch((err: unknown) => failures.push(err));
    }
    if (failures.length > 0) throw failures[0];
  };
  try {
    for (const id of ids) {
      const images = new FakeImages(['python', 'slim'], variants[id] ?? '');
      const {
        cluster: c,
        manager,
        hv,
      } = await startClusterManager(store, id, log, {
        images,
        ...overrides[id],
      });
      c.url = `http://${id}`;
      const handOver = new HandOver(c, manager, link, log);
      c.bindCopies(new SnapshotCopies(c, manager, link, log));
      // Listed before it starts, so that a start that fails stops it too.
      nodes.set(id, {
        cluster: c,
        hv,
        manager,
        handOver,
        drainer: new Drainer(c, manager, handOver, log),
      });
      await c.start();
    }
    await untilNodesMeet(
      [...nodes.values()].map((n) => n.cluster),
      (r) => r.templates.python?.state === 'ready',
    );
  } catch (err) {
    // The nodes started before the failure are stopped: the caller never gets them to stop.
    await stop().catch(() => undefined);
    throw err;
  }
  return {
    nodes,
    at: ids.map((id) => nodes.get(id)!) as { [K in keyof T]: InProcessNode },
    store,
    refuse,
    holdOffers: () => gate.hold(),
    offered,
    get offersHeld() {
      return gate.waiting;
    },
    stop,
  };
}

/**
 * For a describe block: opens clusters as `inProcessCluster` does and stops every one it opened
 * after the block's tests, whether they passed or not.
 */
export function clustersStoppedAfter(): typeof inProcessCluster {
  const stops: (() => Promise<void>)[] = [];
  after(async () => {
    // Every cluster, though one fails to stop; the first failure fails the block after.
    const failures: unknown[] = [];
    for (const s of stops) await s().catch((err: unknown) => failures.push(err));
    if (failures.length > 0) throw failures[0];
  });
  return async (ids, variants, overrides) => {
    const c = await inProcessCluster(ids, variants, overrides);
    stops.push(c.stop);
    return c;
  };
}
