/**
 * A sandbox is an id bound to a machine. The binding can change (merge makes a parent id drive
 * the winner's machine; pause writes the machine to disk and resume binds a new one), which is
 * why the id, the exec queue and the machine are separate.
 */
import type { Machine, PausedMachine } from '../vm/machine.js';
import type { ExecRun } from './exec-run.js';
import type { SandboxRecord } from './journal.js';
import type { HostdError } from '../errors.js';
import { SerialQueue, type Release } from './serial-queue.js';

/** What GET /v1/sandboxes/{id} returns (docs/api.md). */
export interface SandboxInfo {
  id: string;
  state: 'ready' | 'paused' | 'failed';
  template: string;
  created_at: string;
  last_used_at: string;
  /** The sandbox this one was forked from, if any (it may no longer exist). */
  parent_id: string | null;
  /** The snapshot this one was created from, if any. */
  snapshot_id: string | null;
  /** True while an exec, fork, merge, snapshot or pause holds the sandbox. */
  busy: boolean;
  queued: number;
  /** Why the sandbox failed, when it did. */
  error: string | null;
  /** Its egress rules, and the bytes its connections sent and received (docs/api.md, Network). */
  network: { allow_out: string[]; bytes_out: number; bytes_in: number };
  /**
   * Host memory (MiB) that is this sandbox's own, not shared with its template or fork point;
   * null while paused or failed. What a console shows next to a sandbox.
   */
  memory_mib: number | null;
  /**
   * The sandboxes merged into this one, oldest first (the last MAX_MERGES_KEPT): merge removes
   * the winner's id, so this is the only trace a lineage view can draw the merge from.
   */
  merged_from: MergeRecord[];
  /** The caller's labels, given at create (docs/api.md, Metadata and lifetime). */
  metadata: Record<string, string>;
  /** Seconds of running time it is given (from create, resume or `timeout`); null: no limit. */
  timeout: number | null;
  /** What happens when its time is up; null without a timeout. */
  on_timeout: 'delete' | 'pause' | null;
  /** When its time is up, while it runs; null while paused (the clock stops) or without one. */
  expires_at: string | null;
  /** Why a paused sandbox was paused; null while it runs. */
  paused_by: PauseReason | null;
  /**
   * Cluster mode: the node that holds the sandbox (runs it, or keeps its files while paused);
   * absent for a single hostd.
   */
  node?: string;
}

/**
 * Who paused a sandbox: a client (`request`), its lifetime (`lifetime`, on_timeout pause), the
 * idle timeout (`idle`), or hostd's own shutdown (`shutdown`). The E2B front shows the last two
 * as running: E2B's clients did not pause them (docs/e2b.md).
 */
export type PauseReason = 'request' | 'lifetime' | 'idle' | 'shutdown';

/**
 * A running-time limit: at `expiresAt` the sandbox is deleted or paused. The clock runs while
 * the sandbox runs: pausing stops it, and each resume gives the sandbox `timeoutS` again.
 */
export interface Lifetime {
  readonly timeoutS: number;
  readonly onTimeout: 'delete' | 'pause';
}

/** One merge into a sandbox: the winner's id, which is gone since, and when. */
export interface MergeRecord {
  id: string;
  merged_at: string;
}

/** Merges a sandbox remembers: a tree search that merges every round must not grow it forever. */
export const MAX_MERGES_KEPT = 64;

export interface SandboxOrigin {
  readonly template: string;
  readonly parentId: string | null;
  readonly snapshotId: string | null;
  /** `network.allow_out` as given (validated); forks and snapshots carry it on. */
  readonly allowOut?: readonly string[];
  /** Labels; fork children carry them on. */
  readonly metadata?: Readonly<Record<string, string>>;
  /** Its running-time limit; fork children get the same, from their own start. */
  readonly lifetime?: Lifetime | null;
}

export class Sandbox {
  readonly createdAt: Date;
  lastUsedAt = Date.now();
  /** Set when the machine failed; every later operation but delete reports it. */
  brokenReason: string | null = null;
  /** Execs, forks, merges, snapshots and pauses, one at a time in arrival order. */
  readonly queue: SerialQueue;
  /**
   * File operations, one at a time in arrival order, next to `queue` so that they do not wait
   * behind execs. Whatever changes the machine (fork, merge, snapshot, pause) takes both.
   */
  readonly fileQueue: SerialQueue;
  /** Egress rules; a merge gives the parent the winner's. */
  allowOut: readonly string[];
  template: string;
  readonly parentId: string | null;
  readonly snapshotId: string | null;
  /** Winners merged into it, oldest first (at most MAX_MERGES_KEPT). */
  readonly mergedFrom: MergeRecord[] = [];
  /** The running machine; null while paused. Change it with `setMachine`. */
  machine: Machine | null;
  /** Network bytes of the machines it had before this one (a machine counts from zero). */
  private readonly netBefore = { out: 0, in: 0 };
  /** The machine on disk while paused. */
  paused: PausedMachine | null = null;
  pausedAt: Date | null = null;
  /** Who paused it, while paused. */
  pausedBy: PauseReason | null = null;
  /** The exec running now, if any. */
  currentRun: ExecRun | null = null;
  readonly metadata: Readonly<Record<string, string>>;
  /** Its running-time limit, if any; change it through the registry (`setLifetime`). */
  lifetime: Lifetime | null;
  /** When its lifetime ends; null while paused or without one. */
  expiresAt: Date | null = null;

  constructor(
    readonly id: string,
    origin: SandboxOrigin,
    machine: Machine | null,
    maxQueued: number,
    createdAt = new Date(),
  ) {
    this.template = origin.template;
    this.parentId = origin.parentId;
    this.snapshotId = origin.snapshotId;
    this.allowOut = origin.allowOut ?? [];
    this.metadata = { ...origin.metadata };
    this.lifetime = origin.lifetime ?? null;
    this.machine = machine;
    this.createdAt = createdAt;
    this.queue = new SerialQueue(maxQueued);
    this.fileQueue = new SerialQueue(maxQueued);
  }

  /** Both lanes, exec first (always in that order, so two holders never wait on each other). */
  async acquireAll(signal?: AbortSignal): Promise<Release> {
    const execTurn = await this.queue.acquire(signal);
    try {
      const fileTurn = await this.fileQueue.acquire(signal);
      return () => {
        fileTurn();
        execTurn();
      };
    } catch (err) {
      execTurn();
      throw err;
    }
  }

  /** Rejects every waiter of both lanes, now and later. */
  close(err: HostdError): void {
    this.queue.close(err);
    this.fileQueue.close(err);
  }

  get state(): SandboxInfo['state'] {
    if (this.brokenReason) return 'failed';
    return this.paused ? 'paused' : 'ready';
  }

  /** Binds another machine (or none, paused), keeping the network byte counts going. */
  setMachine(machine: Machine | null): void {
    if (this.machine && this.machine !== machine) {
      const stats = this.machine.networkStats();
      this.netBefore.out += stats.bytesOut;
      this.netBefore.in += stats.bytesIn;
    }
    this.machine = machine;
  }

  touch(): void {
    this.lastUsedAt = Date.now();
  }

  /** Remembers that `winnerId` was merged into it now. */
  noteMerge(winnerId: string, at = new Date()): void {
    this.mergedFrom.push({ id: winnerId, merged_at: at.toISOString() });
    if (this.mergedFrom.length > MAX_MERGES_KEPT) this.mergedFrom.shift();
  }

  /** Starts its lifetime's clock (a new or resumed sandbox): it ends `timeoutS` from `now`. */
  startClock(now = Date.now()): void {
    this.expiresAt = this.lifetime ? new Date(now + this.lifetime.timeoutS * 1000) : null;
  }

  info(): SandboxInfo {
    const net = this.machine?.networkStats();
    return {
      id: this.id,
      state: this.state,
      template: this.template,
      created_at: this.createdAt.toISOString(),
      last_used_at: new Date(this.lastUsedAt).toISOString(),
      parent_id: this.parentId,
      snapshot_id: this.snapshotId,
      busy: this.queue.running,
      queued: this.queue.waiting,
      error: this.brokenReason,
      network: {
        allow_out: [...this.allowOut],
        bytes_out: this.netBefore.out + (net?.bytesOut ?? 0),
        bytes_in: this.netBefore.in + (net?.bytesIn ?? 0),
      },
      memory_mib: this.brokenReason ? null : (this.machine?.ownMemoryMib() ?? null),
      merged_from: this.mergedFrom.map((m) => ({ ...m })),
      metadata: { ...this.metadata },
      timeout: this.lifetime?.timeoutS ?? null,
      on_timeout: this.lifetime?.onTimeout ?? null,
      expires_at: this.expiresAt?.toISOString() ?? null,
      paused_by: this.paused ? this.pausedBy : null,
    };
  }

  /** What the journal keeps of it (core/journal.ts). */
  record(): SandboxRecord {
    const base = {
      id: this.id,
      template: this.template,
      parent_id: this.parentId,
      snapshot_id: this.snapshotId,
      created_at: this.createdAt.toISOString(),
      allow_out: [...this.allowOut],
      ...(this.mergedFrom.length > 0
        ? { merged_from: this.mergedFrom.map((m) => ({ ...m })) }
        : {}),
      metadata: { ...this.metadata },
      lifetime: this.lifetime
        ? { timeout_s: this.lifetime.timeoutS, on_timeout: this.lifetime.onTimeout }
        : null,
      expires_at: this.expiresAt?.toISOString() ?? null,
    };
    if (this.paused) {
      return {
        ...base,
        state: 'paused',
        paused: this.paused.describe(),
        paused_at: (this.pausedAt ?? new Date()).toISOString(),
        paused_by: this.pausedBy,
      };
    }
    const { machine } = this;
    return machine
      ? { ...base, state: 'running', vm: machine.id, running: machine.describe() }
      : { ...base, state: 'running' };
  }
}
