/**
 * An in-memory coordination store with etcd's semantics as core/cluster/kv.ts states them
 * (revisions, compare-and-set transactions, leases whose keys go with them, ordered watches),
 * shared by several clients as nodes share one etcd. Tests make faults by hand: `down` makes
 * every call of every client fail (etcd unreachable), `expire(client)` ends a client's lease
 * (its node stopped answering).
 */
import type {
  ClusterKv,
  KvCompare,
  KvEntry,
  KvEvent,
  KvOp,
  TxnResult,
  WatchHandlers,
} from '../../src/core/cluster/kv.js';

interface Stored {
  value: string;
  modRevision: number;
  lease: number | null;
}

export class MemoryStore {
  revision = 0;
  readonly keys = new Map<string, Stored>();
  private readonly watchers = new Set<{ prefix: string; handlers: WatchHandlers }>();
  private leases = 0;
  private isDown = false;
  /** Transactions applied, for tests that count writes. */
  txns = 0;

  /** A client of this store (one per node). */
  client(): MemoryKv {
    return new MemoryKv(this);
  }

  get down(): boolean {
    return this.isDown;
  }

  set down(value: boolean) {
    this.isDown = value;
    for (const w of this.watchers) w.handlers.connection(!value);
  }

  /** The value of `key`, parsed, or undefined. */
  read<T>(key: string): T | undefined {
    const s = this.keys.get(key);
    return s ? (JSON.parse(s.value) as T) : undefined;
  }

  check(): void {
    if (this.isDown) throw new Error('etcd is unreachable (test)');
  }

  newLease(): number {
    return ++this.leases;
  }

  /** Removes every key of lease `id`, as etcd does when the lease expires. */
  dropLease(id: number): void {
    const gone = [...this.keys].filter(([, s]) => s.lease === id).map(([k]) => k);
    if (gone.length === 0) return;
    this.revision++;
    for (const k of gone) {
      this.keys.delete(k);
      this.emit({ type: 'delete', key: k, value: '', modRevision: this.revision });
    }
  }

  txn(compares: readonly KvCompare[], ops: readonly KvOp[], lease: number | null): TxnResult {
    this.check();
    this.txns++;
    const holds = compares.every((c) => (this.keys.get(c.key)?.modRevision ?? 0) === c.modRevision);
    if (!holds) return { succeeded: false, revision: this.revision };
    this.revision++;
    for (const op of ops) {
      if ('put' in op) {
        if (op.lease && lease === null) throw new Error('no lease granted');
        this.keys.set(op.put, {
          value: op.value,
          modRevision: this.revision,
          lease: op.lease ? lease : null,
        });
        this.emit({ type: 'put', key: op.put, value: op.value, modRevision: this.revision });
      } else if (this.keys.delete(op.delete)) {
        this.emit({ type: 'delete', key: op.delete, value: '', modRevision: this.revision });
      }
    }
    return { succeeded: true, revision: this.revision };
  }

  watch(prefix: string, handlers: WatchHandlers): () => void {
    const w = { prefix, handlers };
    this.watchers.add(w);
    return () => this.watchers.delete(w);
  }

  private emit(e: KvEvent): void {
    for (const w of this.watchers) if (e.key.startsWith(w.prefix)) w.handlers.event(e);
  }
}

export class MemoryKv implements ClusterKv {
  lease: number | null = null;
  private onLost: ((why: string) => void) | null = null;

  constructor(readonly store: MemoryStore) {}

  async list(prefix: string): Promise<{ entries: KvEntry[]; revision: number }> {
    this.store.check();
    const entries = [...this.store.keys]
      .filter(([k]) => k.startsWith(prefix))
      .map(([key, s]) => ({ key, value: s.value, modRevision: s.modRevision }));
    return { entries, revision: this.store.revision };
  }

  async get(key: string): Promise<KvEntry | null> {
    this.store.check();
    const s = this.store.keys.get(key);
    return s ? { key, value: s.value, modRevision: s.modRevision } : null;
  }

  async txn(compares: readonly KvCompare[], ops: readonly KvOp[]): Promise<TxnResult> {
    return this.store.txn(compares, ops, this.lease);
  }

  watch(prefix: string, _after: number, handlers: WatchHandlers): () => void {
    return this.store.watch(prefix, handlers);
  }

  async grantLease(_ttlS: number, onLost: (why: string) => void): Promise<void> {
    this.store.check();
    this.lease = this.store.newLease();
    this.onLost = onLost;
  }

  async revokeLease(): Promise<void> {
    if (this.lease !== null) this.store.dropLease(this.lease);
    this.lease = null;
  }

  /** The lease expired (the node stopped answering, or was cut off longer than its TTL). */
  expire(): void {
    if (this.lease === null) return;
    this.store.dropLease(this.lease);
    this.lease = null;
    this.onLost?.('expired (test)');
  }

  async close(): Promise<void> {}
}
