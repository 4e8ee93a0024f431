/**
 * The catalog's records, as JSON values of the coordination store's keys (core/cluster/kv.ts):
 *
 *   nodes/<id>       on the node's lease: where it is, whether it takes creates, its capacity
 *                    and load, its templates. Gone when the node stops answering.
 *   live/<id>        on the lease of the node running sandbox <id>: present while that node is
 *                    alive and holds the VM. An entry `running` without it is a lost sandbox.
 *   sandboxes/<id>   off any lease, changed by compare-and-set only: which node holds the
 *                    sandbox and in which state (running, paused: its files are there, moving:
 *                    handed over to `to`, lost: its VM is gone, with why).
 *   snapshots/<id>   off any lease: the node holding the snapshot's files (and writing the
 *                    entry), the other nodes holding a copy of them, and its name.
 *
 * Field names are snake_case like the API's; operators read them with `etcdctl get --prefix`.
 */

export type NodeState = 'serving' | 'draining' | 'drained';

/** nodes/<id> */
export interface NodeRecord {
  readonly id: string;
  /** Where peers and the proxy reach its API (SERVICE_NODE_URL). */
  readonly url: string;
  /** Where its E2B-compatible front listens, when it has one. */
  readonly e2b_url?: string;
  readonly state: NodeState;
  readonly version: string;
  readonly started_at: string;
  readonly capacity: { readonly sandboxes: number; readonly memory_mib: number };
  readonly load: { readonly sandboxes: number; readonly memory_free_mib: number };
  /** Every template it serves: its state, and the build (image key) it restores. */
  readonly templates: Readonly<
    Record<string, { readonly state: string; readonly build: string | null }>
  >;
  /**
   * Its last drain since it started, running or ended (core/cluster/drain.ts). Absent when it
   * has not drained since it started, and in records of nodes older than drain reports.
   */
  readonly drain?: DrainReport;
}

/**
 * What a drain did: while it runs, `ended_at`, `left` and `snapshots_left` are null and the
 * moved counts grow; once it ended they say what stayed on the node. A drain that ended with
 * something left keeps the node `draining` (it takes no creates), so a client waiting for
 * `drained` reads here that it will not come (docs/cluster.md, Drain).
 */
export interface DrainReport {
  readonly started_at: string;
  readonly ended_at: string | null;
  /** Sandboxes handed to other nodes. */
  readonly moved: number;
  /** Sandboxes still on the node once it ended: failed ones, and those no node took. */
  readonly left: number | null;
  /** Snapshots handed over or left to another node holding a copy. */
  readonly snapshots_moved: number;
  /** Snapshots still on the node once it ended: those no node took. */
  readonly snapshots_left: number | null;
  /**
   * The ids of the sandboxes counted in `left` (sorted, at most LEFT_IDS_SHOWN of them: `left`
   * is the count that holds), so that an operator sees which to look at without reading the
   * node's log; null while it runs. Absent in reports of nodes older than it.
   */
  readonly left_sandboxes?: string[] | null;
  /** The same for `snapshots_left`. */
  readonly left_snapshots?: string[] | null;
  /**
   * When an undrain returned the node to `serving` during or after this round (a running round
   * then starts no further move); null when none has. Absent in reports of older nodes.
   */
  readonly undrained_at?: string | null;
}

/**
 * Most ids a drain report names in `left_sandboxes` and `left_snapshots`: the report is part of
 * the node's record, published every few seconds and copied by every node, so it stays small
 * however much a node holds.
 */
export const LEFT_IDS_SHOWN = 100;

export type SandboxEntryState = 'running' | 'paused' | 'moving' | 'lost';

/** sandboxes/<id> */
export interface SandboxEntry {
  readonly node: string;
  readonly state: SandboxEntryState;
  readonly template: string;
  readonly parent: string | null;
  readonly snapshot: string | null;
  readonly created_at: string;
  /** moving: the node it is handed to. */
  readonly to?: string;
  /** lost: why. */
  readonly error?: string;
}

/** snapshots/<id> */
export interface SnapshotEntry {
  readonly node: string;
  /**
   * Its caller's name, if any: E2B's creates name a snapshot by it (the newest of that name in
   * the cluster). Absent in entries written before names were kept: such a snapshot is found
   * by its id only.
   */
  readonly name?: string | null;
  readonly template: string;
  readonly source_sandbox_id: string;
  readonly size_bytes: number;
  readonly created_at: string;
  /**
   * Other nodes holding a copy of its files under the same id (fetched for a create placed
   * there), each added and removed by that node with a compare-and-set; `node` keeps the
   * entry's other fields. Absent in entries written before copies existed: none.
   */
  readonly copies?: readonly string[];
}

/** Every node holding snapshot `e`'s files: its node, then its copies. */
export function snapshotHolders(e: SnapshotEntry): string[] {
  return [e.node, ...(e.copies ?? []).filter((n) => n !== e.node)];
}

/**
 * Snapshot entry `e` once node `gone` no longer holds its files (it drains, or is forgotten):
 * when `gone` was its node, the first other holder `live` accepts takes it over. Null when
 * `gone` was its node and no live holder is left (the snapshot must be handed over, or goes).
 */
export function withoutHolder(
  e: SnapshotEntry,
  gone: string,
  live: (node: string) => boolean,
): SnapshotEntry | null {
  const node = e.node !== gone ? e.node : snapshotHolders(e).find((n) => n !== gone && live(n));
  if (node === undefined) return null;
  return { ...e, node, copies: (e.copies ?? []).filter((n) => n !== gone && n !== node) };
}

export const KEYS = {
  node: (id: string) => `nodes/${id}`,
  sandbox: (id: string) => `sandboxes/${id}`,
  live: (id: string) => `live/${id}`,
  snapshot: (id: string) => `snapshots/${id}`,
} as const;

/** Node ids: short, safe in keys, URLs and logs. */
export const NODE_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

/** The record's kind and id from a key, or null for a key that is none of ours. */
export function parseKey(
  key: string,
): { kind: 'node' | 'sandbox' | 'live' | 'snapshot'; id: string } | null {
  const slash = key.indexOf('/');
  if (slash < 0) return null;
  const id = key.slice(slash + 1);
  switch (key.slice(0, slash)) {
    case 'nodes':
      return { kind: 'node', id };
    case 'sandboxes':
      return { kind: 'sandbox', id };
    case 'live':
      return { kind: 'live', id };
    case 'snapshots':
      return { kind: 'snapshot', id };
    default:
      return null;
  }
}

/** JSON of a stored value, or null when it is not JSON (a key written by something else). */
export function parseValue<T>(value: string): T | null {
  try {
    return JSON.parse(value) as T;
  } catch {
    return null;
  }
}
