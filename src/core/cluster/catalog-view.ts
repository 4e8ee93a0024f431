/**
 * This node's copy of the whole catalog (core/cluster/records.ts): read once, then kept current
 * by a watch, so that routing a request, placing a create or listing the cluster reads memory,
 * not etcd. While the store is unreachable the copy stays as it was last seen: requests for
 * sandboxes placed before keep being routed. A lookup that misses here is retried against the
 * store (`fresh`): a sandbox created a moment ago through another node may not have reached this
 * copy yet.
 */
import type { ClusterKv, KvEntry, KvEvent } from './kv.js';
import {
  KEYS,
  parseKey,
  parseValue,
  type NodeRecord,
  type SandboxEntry,
  type SnapshotEntry,
} from './records.js';

/** A record with the revision of its last change (what a compare-and-set compares). */
export interface Versioned<T> {
  readonly value: T;
  readonly modRevision: number;
}

/** A sandbox's entry, and the node whose lease holds its live key (null: none). */
export interface SandboxLookup extends Versioned<SandboxEntry> {
  readonly liveOn: string | null;
}

type Listener = () => void;

export class CatalogView {
  readonly nodes = new Map<string, NodeRecord>();
  readonly sandboxes = new Map<string, Versioned<SandboxEntry>>();
  /** Sandbox id -> the node whose lease holds its live key. */
  readonly live = new Map<string, string>();
  readonly snapshots = new Map<string, Versioned<SnapshotEntry>>();
  private stopWatch: (() => void) | null = null;
  private listeners = new Set<Listener>();
  private goneListeners = new Set<(id: string) => void>();
  private up = false;
  private loaded = false;

  constructor(private readonly kv: ClusterKv) {}

  /** True while the watch is connected to the store. */
  get connected(): boolean {
    return this.up;
  }

  /** True once the catalog was read at least once. */
  get ready(): boolean {
    return this.loaded;
  }

  /** Reads the catalog and watches it from there on; rejects when the store is unreachable. */
  async start(): Promise<void> {
    const { entries, revision } = await this.kv.list('');
    const before = this.loaded ? [...this.snapshots.keys()] : [];
    this.nodes.clear();
    this.sandboxes.clear();
    this.live.clear();
    this.snapshots.clear();
    for (const e of entries) this.apply({ type: 'put', ...e });
    this.loaded = true;
    this.up = true;
    // Deletes that happened while the watch was down (it is read again, not replayed).
    for (const id of before) if (!this.snapshots.has(id)) this.snapshotGone(id);
    this.stopWatch?.();
    this.stopWatch = this.kv.watch('', revision, {
      event: (e) => {
        this.apply(e);
        this.changed();
      },
      reset: () => void this.restart(),
      connection: (up) => {
        this.up = up;
        this.changed();
      },
    });
    this.changed();
  }

  stop(): void {
    this.stopWatch?.();
    this.stopWatch = null;
  }

  /**
   * Sandbox `id`'s entry and the node whose lease holds its live key (null: none), from this
   * copy, or from the store when this copy does not know it or `fresh` asks (null when neither
   * knows it). What the store says is not kept here: the watch brings it, in order. Rejects
   * only when the store is asked and unreachable.
   */
  async lookup(id: string, fresh = false): Promise<SandboxLookup | null> {
    const known = this.sandboxes.get(id);
    if (known && !fresh) return { ...known, liveOn: this.live.get(id) ?? null };
    const [entry, live] = await Promise.all([
      this.kv.get(KEYS.sandbox(id)),
      this.kv.get(KEYS.live(id)),
    ]);
    const value = entry ? parseValue<SandboxEntry>(entry.value) : null;
    if (!entry || !value) return null;
    return { value, modRevision: entry.modRevision, liveOn: live?.value ?? null };
  }

  /** The same for a snapshot. */
  async snapshot(id: string): Promise<Versioned<SnapshotEntry> | null> {
    const known = this.snapshots.get(id);
    if (known) return known;
    const entry = await this.kv.get(KEYS.snapshot(id));
    const value = entry ? parseValue<SnapshotEntry>(entry.value) : null;
    return entry && value ? { value, modRevision: entry.modRevision } : null;
  }

  /**
   * Every snapshot entry in the store, read now (not this copy): a name lookup that misses here
   * may be of a snapshot taken a moment ago through another node, whose entry the watch has not
   * brought yet. Rejects when the store is unreachable.
   */
  async snapshotsFresh(): Promise<Map<string, SnapshotEntry>> {
    const { entries } = await this.kv.list(KEYS.snapshot(''));
    const out = new Map<string, SnapshotEntry>();
    for (const e of entries) {
      const parsed = parseKey(e.key);
      const value = parseValue<SnapshotEntry>(e.value);
      if (parsed?.kind === 'snapshot' && value) out.set(parsed.id, value);
    }
    return out;
  }

  /** Sandboxes whose live key is on `node`'s lease: those it runs. */
  liveCount(node: string): number {
    let n = 0;
    for (const owner of this.live.values()) if (owner === node) n++;
    return n;
  }

  /**
   * Resolves with `probe`'s first non-null answer, evaluated now and after every change, or with
   * null after `timeoutMs` (or when `signal` aborts).
   */
  waitFor<T>(probe: () => T | null, timeoutMs: number, signal?: AbortSignal): Promise<T | null> {
    const now = probe();
    if (now !== null) return Promise.resolve(now);
    return new Promise((resolve) => {
      const done = (value: T | null): void => {
        clearTimeout(timer);
        this.listeners.delete(check);
        signal?.removeEventListener('abort', onAbort);
        resolve(value);
      };
      const check = (): void => {
        const value = probe();
        if (value !== null) done(value);
      };
      const onAbort = (): void => done(null);
      const timer = setTimeout(() => done(null), timeoutMs);
      this.listeners.add(check);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Calls `listener` after every change seen; returns how to stop. */
  onChange(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Calls `listener` with the id of every snapshot entry deleted after it was seen here (not
   * for entries never seen: one read from the store a moment ago may not be here yet).
   */
  onSnapshotGone(listener: (id: string) => void): () => void {
    this.goneListeners.add(listener);
    return () => this.goneListeners.delete(listener);
  }

  private snapshotGone(id: string): void {
    for (const l of [...this.goneListeners]) l(id);
  }

  private changed(): void {
    for (const l of [...this.listeners]) l();
  }

  private async restart(): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.start();
        return;
      } catch {
        await new Promise((r) => setTimeout(r, Math.min(5000, 200 * 2 ** attempt)));
      }
    }
  }

  private apply(e: KvEvent | (KvEntry & { type: 'put' })): void {
    const parsed = parseKey(e.key);
    if (!parsed) return;
    const { kind, id } = parsed;
    if (e.type === 'delete') {
      if (kind === 'node') this.nodes.delete(id);
      else if (kind === 'sandbox') this.sandboxes.delete(id);
      else if (kind === 'live') this.live.delete(id);
      else if (this.snapshots.delete(id)) this.snapshotGone(id);
      return;
    }
    if (kind === 'live') {
      this.live.set(id, e.value);
      return;
    }
    if (kind === 'node') {
      const value = parseValue<NodeRecord>(e.value);
      if (value) this.nodes.set(id, value);
    } else if (kind === 'sandbox') {
      const value = parseValue<SandboxEntry>(e.value);
      const current = this.sandboxes.get(id);
      if (value && (!current || current.modRevision <= e.modRevision)) {
        this.sandboxes.set(id, { value, modRevision: e.modRevision });
      }
    } else {
      const value = parseValue<SnapshotEntry>(e.value);
      if (value) this.snapshots.set(id, { value, modRevision: e.modRevision });
    }
  }
}
