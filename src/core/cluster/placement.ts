/**
 * Where a new sandbox goes, decided by the node that received the create: among the nodes that
 * take creates (`serving`) and serve the template (its build ready), the least loaded of a few
 * picked at random ("best of a few": with many nodes, comparing a sample spreads load as well
 * as comparing all, and receivers with slightly different views do not all pick the same node).
 * Load is the node's running sandboxes against its capacity (its cap, which follows its memory);
 * a node short of memory goes last. The answer is an order: when the first refuses (full: 429 or
 * 503) the next is asked. (A create from a snapshot is not placed: it goes to the snapshot's
 * holder, core/cluster/cluster-node.ts `placeCreate`.)
 *
 * Pure: the caller passes the catalog's nodes and counts, and its random source.
 */
import type { NodeRecord } from './records.js';

export interface PlacementRequest {
  readonly template: string;
  /** On equal load, this node first: the receiving node (no hop). */
  readonly self?: string | null;
}

export interface PlacementView {
  readonly nodes: readonly NodeRecord[];
  /** Sandboxes running on a node now (its live keys: exact, unlike its periodic load figures). */
  readonly running: (node: string) => number;
  /** Nodes compared at random before the rest (default 3). */
  readonly sample?: number;
  /** Memory (MiB) under which a node is placed after all others. */
  readonly lowMemoryMib?: number;
  readonly random?: () => number;
}

/** Node ids in the order to ask them; empty when no node can take the template. */
export function placementOrder(view: PlacementView, req: PlacementRequest): string[] {
  const random = view.random ?? Math.random;
  const lowMemory = view.lowMemoryMib ?? 0;
  const eligible = view.nodes.filter(
    (n) => n.state === 'serving' && n.templates[req.template]?.state === 'ready',
  );
  const load = (n: NodeRecord): number => {
    const short = n.load.memory_free_mib < lowMemory ? 1 : 0;
    return short + view.running(n.id) / Math.max(1, n.capacity.sandboxes);
  };
  const rank = (n: NodeRecord): number[] => [load(n), n.id === req.self ? 0 : 1];
  // Fisher-Yates over a copy: the sample, then the rest.
  const shuffled = [...eligible];
  for (let i = shuffled.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [shuffled[i], shuffled[j]] = [shuffled[j]!, shuffled[i]!];
  }
  const k = Math.min(shuffled.length, Math.max(1, view.sample ?? 3));
  const byRank = (a: NodeRecord, b: NodeRecord): number => {
    const ra = rank(a);
    const rb = rank(b);
    for (let i = 0; i < ra.length; i++) if (ra[i] !== rb[i]) return ra[i]! - rb[i]!;
    return 0; // stable: the shuffle breaks remaining ties
  };
  const sample = shuffled.slice(0, k).sort(byRank);
  const rest = shuffled.slice(k).sort(byRank);
  return [...sample, ...rest].map((n) => n.id);
}
