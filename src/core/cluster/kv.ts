/**
 * What cluster mode needs of its coordination store, and nothing more: keys with revisions,
 * atomic compare-and-set transactions, one lease per node, and an ordered watch. etcd provides it
 * (src/cluster/etcd-kv.ts); unit tests use an in-memory fake (test/helpers/memory-kv.ts), so the
 * catalog's logic is tested in milliseconds. Keys are relative to the store's prefix
 * (`/hostd/` in etcd): `nodes/<id>`, `sandboxes/<id>`, `live/<id>`, `snapshots/<id>`.
 */

/** A key as read: its value (JSON text) and the revision of its last change. */
export interface KvEntry {
  readonly key: string;
  readonly value: string;
  readonly modRevision: number;
}

/** Holds when `key`'s last change is `modRevision`; 0 means "the key does not exist". */
export interface KvCompare {
  readonly key: string;
  readonly modRevision: number;
}

/** A write of a transaction; `lease` attaches the key to this client's lease (gone with it). */
export type KvOp =
  | { readonly put: string; readonly value: string; readonly lease?: boolean }
  | { readonly delete: string };

/** One change seen by a watch, in revision order. */
export interface KvEvent {
  readonly type: 'put' | 'delete';
  readonly key: string;
  /** The new value ('' for a delete). */
  readonly value: string;
  readonly modRevision: number;
}

export interface WatchHandlers {
  event(e: KvEvent): void;
  /** The watch could not go on from where it was (history compacted): read everything again. */
  reset(): void;
  /** The connection to the store went down or came back. */
  connection(up: boolean): void;
}

export interface ClusterKv {
  /** Every key under `prefix`, at one revision. */
  list(prefix: string): Promise<{ entries: KvEntry[]; revision: number }>;
  get(key: string): Promise<KvEntry | null>;
  /**
   * Applies `ops` atomically if every compare holds. Resolves with whether it did, and the
   * store's revision after it (the `modRevision` of every key it wrote).
   */
  txn(compares: readonly KvCompare[], ops: readonly KvOp[]): Promise<TxnResult>;
  /** Calls `handlers.event` for every change under `prefix` after `afterRevision`, in order. */
  watch(prefix: string, afterRevision: number, handlers: WatchHandlers): () => void;
  /**
   * Grants this client a lease of `ttlS` seconds, kept alive until `revokeLease` or until it
   * cannot be (the store unreachable for longer than the TTL): then `onLost` is called once, and
   * every key on it is gone. Writes with `lease: true` go on the current lease.
   */
  grantLease(ttlS: number, onLost: (why: string) => void): Promise<void>;
  /** Ends the lease now: its keys go at once (a clean stop). */
  revokeLease(): Promise<void>;
  close(): Promise<void>;
}

export interface TxnResult {
  readonly succeeded: boolean;
  readonly revision: number;
}
