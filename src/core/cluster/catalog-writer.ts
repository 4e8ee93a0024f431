/**
 * Keeps the catalog entries of what this node holds (its sandboxes and snapshots) equal to what
 * it holds, by compare-and-set. Callers say what an entry should be (`set`); the writer writes
 * it, retrying while the store is unreachable (an etcd outage: a pause or a delete made meanwhile
 * reaches the catalog when etcd is back, nothing is lost), and `confirm` waits for it (a create
 * is not answered before its entry exists: other nodes must find it).
 *
 * Every write compares the entry's revision with the one this node last wrote or read. When the
 * entry changed under it, it is re-read: still ours (a write whose answer was lost, or our record
 * from before a restart), the write is redone on the new revision; gone, or now another node's (a
 * delete made through another node while this one was away, a hand-over), it is a conflict the
 * owner resolves by destroying its local copy (fencing), and nothing is written. A snapshot's
 * entry keeps the `copies` other nodes wrote into it.
 */
import { fail, type HostdError } from '../../errors.js';
import type { ClusterKv, KvOp } from './kv.js';
import { KEYS, parseValue, type SandboxEntry, type SnapshotEntry } from './records.js';

/** How the first write of an entry compares: 0 = must not exist; `adopt` = take ours as found. */
export type Expect = number | 'adopt';

type Kind = 'sandbox' | 'snapshot';

interface Slot {
  readonly kind: Kind;
  readonly id: string;
  /** JSON of the wanted entry, null: no entry. */
  value: string | null;
  live: boolean;
  /** Revision the next write compares with; null: adopt what the store holds if it is ours. */
  rev: number | null;
  /** Bumped by every `set`; `written` is the last one applied. */
  wanted: number;
  written: number;
  busy: boolean;
  waiters: { upTo: number; resolve: () => void; reject: (err: HostdError) => void }[];
  /** Set when the entry was found to be another node's (or gone): nothing more is written. */
  conflict: boolean;
}

export interface WriterOptions {
  readonly node: string;
  /** Called once per conflict: the entry is gone (null) or another node's. */
  readonly onConflict: (
    kind: Kind,
    id: string,
    current: SandboxEntry | SnapshotEntry | null,
  ) => void;
  /** Logged, never thrown: the writer retries. */
  readonly onError?: (err: unknown, kind: Kind, id: string) => void;
  /** Longest wait between two attempts while the store is unreachable. */
  readonly maxBackoffMs?: number;
}

const CONCURRENCY = 8;

export class CatalogWriter {
  private readonly slots = new Map<string, Slot>();
  /** Entries whose last write ended in a conflict: `confirm` reports it. */
  private readonly conflicted = new Set<string>();
  private running = 0;
  private readonly queue: Slot[] = [];
  private paused = true;
  private failures = 0;
  private retryTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly kv: ClusterKv,
    private readonly options: WriterOptions,
  ) {}

  /**
   * Wants sandbox `id`'s entry to be `entry` (null: removed) with its live key (on this node's
   * lease) when `live`. `expect` applies when the writer does not know the entry yet.
   */
  setSandbox(id: string, entry: SandboxEntry | null, live: boolean, expect: Expect): void {
    this.set('sandbox', id, entry, live, expect);
  }

  setSnapshot(id: string, entry: SnapshotEntry | null, expect: Expect): void {
    this.set('snapshot', id, entry, false, expect);
  }

  /** Whether the writer tracks `id` (it has written, or is to write, its entry). */
  has(kind: Kind, id: string): boolean {
    return this.slots.has(`${kind}/${id}`);
  }

  /** Whether `id`'s entry has a write still to make (a new entry not in the store yet). */
  pending(kind: Kind, id: string): boolean {
    const slot = this.slots.get(`${kind}/${id}`);
    return slot !== undefined && slot.written < slot.wanted;
  }

  /** Stops writing `id`'s entry: it is no longer this node's to write (handed over). */
  forget(kind: Kind, id: string): void {
    const slot = this.slots.get(`${kind}/${id}`);
    if (!slot) return;
    this.slots.delete(`${kind}/${id}`);
    slot.conflict = true;
    for (const w of slot.waiters.splice(0)) w.reject(fail('clusterConflict', id));
  }

  /**
   * Resolves once every listed entry is written as last set; rejects with 503
   * cluster_unavailable after `timeoutMs`, or with the conflict that stopped a write.
   */
  confirm(keys: readonly { kind: Kind; id: string }[], timeoutMs: number): Promise<void> {
    const pending = keys.flatMap(({ kind, id }) => {
      const slot = this.slots.get(`${kind}/${id}`);
      if (!slot && this.conflicted.has(`${kind}/${id}`)) {
        return [Promise.reject(fail('clusterConflict', id))];
      }
      if (!slot) return [];
      if (slot.conflict) return [Promise.reject(fail('clusterConflict', id))];
      if (slot.written >= slot.wanted) return [];
      return [
        new Promise<void>((resolve, reject) =>
          slot.waiters.push({ upTo: slot.wanted, resolve, reject }),
        ),
      ];
    });
    if (pending.length === 0) return Promise.resolve();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(fail('clusterUnavailable', 'the catalog write did not complete in time')),
        timeoutMs,
      );
    });
    return Promise.race([Promise.all(pending).then(() => undefined), timeout]).finally(() =>
      clearTimeout(timer),
    );
  }

  /** Resolves once nothing waits to be written; rejects (503) after `timeoutMs`. */
  settle(timeoutMs: number): Promise<void> {
    const keys = [...this.slots.values()]
      .filter((s) => s.written < s.wanted)
      .map((s) => ({ kind: s.kind, id: s.id }));
    return this.confirm(keys, timeoutMs);
  }

  /** Starts writing (after the catalog was read: `adopt` compares need it). */
  start(): void {
    this.paused = false;
    for (const slot of this.slots.values()) this.schedule(slot);
  }

  stop(): void {
    this.paused = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
  }

  /** The lease was granted anew: every live key must be written again on it. */
  relive(): void {
    for (const slot of this.slots.values()) {
      if (slot.live && !slot.conflict) {
        slot.wanted++;
        this.schedule(slot);
      }
    }
  }

  /** Entries not yet written as wanted (for `GET /v1/cluster` and logs). */
  get backlog(): number {
    let n = 0;
    for (const slot of this.slots.values()) if (slot.written < slot.wanted) n++;
    return n;
  }

  private set(
    kind: Kind,
    id: string,
    entry: SandboxEntry | SnapshotEntry | null,
    live: boolean,
    expect: Expect,
  ): void {
    const key = `${kind}/${id}`;
    this.conflicted.delete(key);
    let slot = this.slots.get(key);
    if (!slot) {
      slot = {
        kind,
        id,
        value: null,
        live: false,
        rev: expect === 'adopt' ? null : expect,
        wanted: 0,
        written: 0,
        busy: false,
        waiters: [],
        conflict: false,
      };
      this.slots.set(key, slot);
    }
    if (slot.conflict) return;
    slot.value = entry === null ? null : JSON.stringify(entry);
    slot.live = entry !== null && live;
    slot.wanted++;
    this.schedule(slot);
  }

  private schedule(slot: Slot): void {
    if (this.paused || slot.busy || slot.conflict || slot.written >= slot.wanted) return;
    if (this.queue.includes(slot)) return;
    this.queue.push(slot);
    this.pump();
  }

  private pump(): void {
    while (!this.paused && this.running < CONCURRENCY && this.queue.length > 0) {
      if (this.retryTimer) return; // backing off: the timer pumps again
      const slot = this.queue.shift()!;
      this.running++;
      slot.busy = true;
      void this.write(slot).finally(() => {
        slot.busy = false;
        this.running--;
        this.schedule(slot);
        this.pump();
      });
    }
  }

  private async write(slot: Slot): Promise<void> {
    const target = slot.wanted;
    const key = slot.kind === 'sandbox' ? KEYS.sandbox(slot.id) : KEYS.snapshot(slot.id);
    try {
      if (slot.rev === null && !(await this.adopt(slot, key))) return;
      const ops: KvOp[] = [];
      if (slot.value === null) ops.push({ delete: key });
      else if (slot.kind === 'snapshot')
        ops.push({ put: key, value: await this.keepCopies(key, slot.value) });
      else ops.push({ put: key, value: slot.value });
      if (slot.kind === 'sandbox') {
        const liveKey = KEYS.live(slot.id);
        ops.push(
          slot.live ? { put: liveKey, value: this.options.node, lease: true } : { delete: liveKey },
        );
      }
      const res = await this.kv.txn([{ key, modRevision: slot.rev! }], ops);
      if (res.succeeded) {
        slot.rev = slot.value === null ? 0 : res.revision;
        this.done(slot, target);
      } else if (await this.adopt(slot, key)) {
        // Ours at another revision: the next round writes on it.
      }
      this.failures = 0;
    } catch (err) {
      this.options.onError?.(err, slot.kind, slot.id);
      this.backOff();
    }
  }

  /**
   * A snapshot entry as wanted, with the copies other nodes listed in the stored one (each node
   * adds and removes itself: core/cluster/snapshot-copies.ts). Read at the revision the write
   * compares with, or the write fails and is redone on the new one.
   */
  private async keepCopies(key: string, wanted: string): Promise<string> {
    const current = await this.kv.get(key);
    const stored = current ? parseValue<SnapshotEntry>(current.value) : null;
    const copies = (stored?.copies ?? []).filter((n) => n !== this.options.node);
    if (copies.length === 0) return wanted;
    return JSON.stringify({ ...(JSON.parse(wanted) as SnapshotEntry), copies });
  }

  /**
   * Reads the entry as stored and takes its revision if it is ours; false (after reporting the
   * conflict) when it is gone or another node's. A removal of an entry that is gone is done.
   */
  private async adopt(slot: Slot, key: string): Promise<boolean> {
    const current = await this.kv.get(key);
    const value = current ? parseValue<SandboxEntry | SnapshotEntry>(current.value) : null;
    if (!current || !value) {
      if (slot.value === null) {
        slot.rev = 0;
        // Its live key may remain (written by an earlier lease of ours): it goes with the lease.
        this.done(slot, slot.wanted);
        return false;
      }
      this.conflict(slot, null);
      return false;
    }
    if (value.node !== this.options.node) {
      this.conflict(slot, value);
      return false;
    }
    slot.rev = current.modRevision;
    return true;
  }

  private done(slot: Slot, upTo: number): void {
    slot.written = Math.max(slot.written, upTo);
    slot.waiters = slot.waiters.filter((w) => {
      if (w.upTo > slot.written) return true;
      w.resolve();
      return false;
    });
    // A removed entry needs no slot any more, unless something was set since.
    if (slot.value === null && slot.written >= slot.wanted) {
      this.slots.delete(`${slot.kind}/${slot.id}`);
    }
  }

  private conflict(slot: Slot, current: SandboxEntry | SnapshotEntry | null): void {
    slot.conflict = true;
    this.slots.delete(`${slot.kind}/${slot.id}`);
    this.conflicted.add(`${slot.kind}/${slot.id}`);
    for (const w of slot.waiters.splice(0)) w.reject(fail('clusterConflict', slot.id));
    this.options.onConflict(slot.kind, slot.id, current);
  }

  private backOff(): void {
    this.failures++;
    if (this.retryTimer) return;
    const ms = Math.min(this.options.maxBackoffMs ?? 5000, 100 * 2 ** Math.min(this.failures, 8));
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.pump();
    }, ms);
    this.retryTimer.unref?.();
  }
}
