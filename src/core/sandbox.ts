/**
 * A sandbox is an id bound to a machine. The binding can change (merge makes a parent id drive
 * the winner's machine; pause writes the machine to disk and resume binds a new one), which is
 * why the id, the exec queue and the machine are separate.
 *
 * What it is bound to is its state (`SandboxState`), and only the sandbox changes it, through
 * one method per transition; each tells its host (the registry) what must follow: its journal
 * record rewritten or removed, stop listeners told, the lifetime timer re-armed. Other modules
 * read the state; none assigns it.
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

/**
 * Where a sandbox is, and what it holds there. Only the sandbox's transition methods change it:
 *
 *   running --pause--> paused --resume/adopt--> running
 *   running --fail---> failed --adopt (merge)--> running
 *   running, paused, failed, lost --delete--> deleted (final)
 *
 * `lost` is only ever a start state (read back from the journal: its VM or files are gone),
 * and `deleted` is final. Cluster mode adds no local state today: a sandbox held by another
 * node has no `Sandbox` here (core/cluster/catalog-view.ts routes to it), and the catalog's
 * `moving` (a hand-over) has no writer yet; a hand-over would be a transition out of `paused`.
 */
export type SandboxState =
  /** Its machine runs (or is about to be found dead: `ensureUsable` checks `alive`). */
  | { readonly kind: 'running'; readonly machine: Machine }
  /** Its machine is on disk; `at` is when it was paused, `by` who paused it (null: unknown). */
  | {
      readonly kind: 'paused';
      readonly paused: PausedMachine;
      readonly at: Date;
      readonly by: PauseReason | null;
    }
  /** Its machine died while hostd ran; kept for its log tail and network counts. */
  | { readonly kind: 'failed'; readonly machine: Machine; readonly why: string }
  /** Its VM or files were gone when hostd started: only its record is left, as it was. */
  | { readonly kind: 'lost'; readonly why: string; readonly record: SandboxRecord }
  /** Deleted, merged away or fenced: nothing is left, and no operation may start on it. */
  | { readonly kind: 'deleted'; readonly why: string };

export type SandboxStateKind = SandboxState['kind'];

/** Why a sandbox stopped running: deleted (merged away, expired), paused, or its VM failed. */
export type StopReason = 'deleted' | 'paused' | 'failed';

/**
 * A transition the state machine does not have (resume a deleted sandbox, pause a paused one):
 * a bug in hostd, never a client's error, so it is not in the error registry; the api layer
 * answers it as any unexpected error (500 internal_error, the details in the log).
 */
export class IllegalSandboxTransition extends Error {
  constructor(
    readonly sandboxId: string,
    readonly from: SandboxStateKind,
    readonly transition: string,
  ) {
    super(`sandbox ${sandboxId}: no transition '${transition}' from state '${from}'`);
    this.name = 'IllegalSandboxTransition';
  }
}

/**
 * What a sandbox's transitions need from whoever keeps it (core/registry.ts): each transition
 * calls the hooks its change requires, so no caller can change a state and forget the journal.
 */
export interface SandboxHost {
  /** Writes the sandbox's journal record (`record()`), as it is now. */
  save(sandbox: Sandbox): void;
  /** Removes the sandbox's journal record and forgets it: its id is free. */
  forget(sandbox: Sandbox): void;
  /** Tells stop listeners that it stopped running. */
  stopped(sandbox: Sandbox, why: StopReason): void;
  /** Its `expiresAt` may have changed (core/lifetimes.ts re-arms). */
  expiryChanged(): void;
}

/** How a sandbox starts: a machine that runs, one on disk (read back), or a lost record. */
export type InitialState =
  /** `expiresAt`: when its lifetime ends, if it was already known (a re-adopted VM's). */
  | { readonly kind: 'running'; readonly machine: Machine; readonly expiresAt?: Date | null }
  | Extract<SandboxState, { kind: 'paused' }>
  | Extract<SandboxState, { kind: 'lost' }>;

/** What a merge's parent takes from the winner (`Sandbox.adoptMerged`). */
export interface MergeWinner {
  readonly id: string;
  readonly machine: Machine;
  readonly template: string;
  readonly allowOut: readonly string[];
}

/** A sandbox that holds a running machine: what an operation holding its turn drives. */
export type RunningSandbox = Sandbox & { readonly machine: Machine };

export class Sandbox {
  readonly createdAt: Date;
  /** Execs, forks, merges, snapshots and pauses, one at a time in arrival order. */
  readonly queue: SerialQueue;
  /**
   * File operations, one at a time in arrival order, next to `queue` so that they do not wait
   * behind execs. Whatever changes the machine (fork, merge, snapshot, pause) takes both.
   */
  readonly fileQueue: SerialQueue;
  readonly parentId: string | null;
  readonly snapshotId: string | null;
  /** Winners merged into it, oldest first (at most MAX_MERGES_KEPT). */
  private readonly merges: MergeRecord[] = [];
  private current: SandboxState;
  private templateName: string;
  private egress: readonly string[];
  private limit: Lifetime | null;
  private expiry: Date | null = null;
  /** Network bytes of the machines it had before this one (a machine counts from zero). */
  private readonly netBefore = { out: 0, in: 0 };
  private lastUsed = Date.now();
  private run_: ExecRun | null = null;
  readonly metadata: Readonly<Record<string, string>>;

  constructor(
    readonly id: string,
    origin: SandboxOrigin,
    initial: InitialState,
    maxQueued: number,
    private readonly host: SandboxHost,
    createdAt = new Date(),
    mergedFrom: readonly MergeRecord[] = [],
  ) {
    this.templateName = origin.template;
    this.parentId = origin.parentId;
    this.snapshotId = origin.snapshotId;
    this.egress = origin.allowOut ?? [];
    this.metadata = { ...origin.metadata };
    this.limit = origin.lifetime ?? null;
    this.merges.push(...mergedFrom.map((m) => ({ ...m })));
    this.createdAt = createdAt;
    this.queue = new SerialQueue(maxQueued);
    this.fileQueue = new SerialQueue(maxQueued);
    if (initial.kind === 'running') {
      this.current = { kind: 'running', machine: initial.machine };
      if (initial.expiresAt && this.limit) this.expiry = initial.expiresAt;
      else this.startClock();
    } else {
      this.current = initial;
    }
  }

  /** When a request last used it (ms since the epoch): the idle reaper reads it. */
  get lastUsedAt(): number {
    return this.lastUsed;
  }

  /** The exec running now, if any: its lifetime's end and shutdown interrupt it. */
  get currentRun(): ExecRun | null {
    return this.run_;
  }

  /** Notes `run` as its running exec until it ends. */
  trackRun(run: ExecRun): void {
    this.run_ = run;
    void run.done.then(() => {
      if (this.run_ === run) this.run_ = null;
    });
  }

  /** Where it is now; change it only through the transition methods below. */
  get status(): SandboxState {
    return this.current;
  }

  /** Its template; a merge gives it the winner's. */
  get template(): string {
    return this.templateName;
  }

  /** Egress rules; a merge gives it the winner's. */
  get allowOut(): readonly string[] {
    return this.egress;
  }

  /** Winners merged into it, oldest first (at most MAX_MERGES_KEPT). */
  get mergedFrom(): readonly MergeRecord[] {
    return this.merges;
  }

  /** Its running-time limit, if any; change it with `setLifetime`. */
  get lifetime(): Lifetime | null {
    return this.limit;
  }

  /** When its lifetime ends; null while paused or without one. */
  get expiresAt(): Date | null {
    return this.expiry;
  }

  /** The machine it drives: running, or the dead one of a failed sandbox; else null. */
  get machine(): Machine | null {
    const s = this.current;
    return s.kind === 'running' || s.kind === 'failed' ? s.machine : null;
  }

  /** The machine on disk while paused, else null. */
  get paused(): PausedMachine | null {
    return this.current.kind === 'paused' ? this.current.paused : null;
  }

  /** When it was paused, while paused. */
  get pausedAt(): Date | null {
    return this.current.kind === 'paused' ? this.current.at : null;
  }

  /** Who paused it, while paused. */
  get pausedBy(): PauseReason | null {
    return this.current.kind === 'paused' ? this.current.by : null;
  }

  /**
   * Why no operation but delete may run on it (failed, lost, deleted); null while it runs or
   * is paused.
   */
  get brokenReason(): string | null {
    const s = this.current;
    return s.kind === 'failed' || s.kind === 'lost' || s.kind === 'deleted' ? s.why : null;
  }

  /** True while it holds a running machine: narrows it for operations that drive it. */
  isRunning(): this is RunningSandbox {
    return this.current.kind === 'running';
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

  // ---- transitions ------------------------------------------------------------------------

  /**
   * paused -> running (resume: `machine` was restored from its files). Its lifetime starts
   * again whole. Journaled: a restart re-adopts the running VM.
   */
  resume(machine: Machine): void {
    this.expect('resume', 'paused');
    this.run(machine);
    this.startClock();
    this.host.save(this);
    this.host.expiryChanged();
  }

  /**
   * running, paused or failed -> running on `winner`'s machine (merge): the parent takes the
   * winner's machine, template and egress rules, and notes the merge, all in one journal write.
   * A paused parent's lifetime starts again, as on resume; a running one's runs on. `winner` is
   * what the winner was before it was deleted (its record goes first: a restart must not find
   * two sandboxes on one VM).
   */
  adoptMerged(winner: MergeWinner): void {
    const from = this.expect('merge', 'running', 'paused', 'failed');
    this.egress = winner.allowOut;
    this.templateName = winner.template;
    this.merges.push({ id: winner.id, merged_at: new Date().toISOString() });
    if (this.merges.length > MAX_MERGES_KEPT) this.merges.shift();
    this.run(winner.machine);
    if (from === 'paused') this.startClock();
    this.host.save(this);
    this.host.expiryChanged();
  }

  /**
   * running -> paused: `paused` is its machine written to disk by `by`. Its lifetime's clock
   * stops. Journaled (the record is synced: it outlives a reboot).
   */
  pause(paused: PausedMachine, by: PauseReason): void {
    this.expect('pause', 'running');
    this.leaveMachine();
    this.current = { kind: 'paused', paused, at: new Date(), by };
    this.expiry = null;
    this.host.save(this);
    this.host.stopped(this, 'paused');
    this.host.expiryChanged();
  }

  /**
   * paused -> paused, paused by `by` now (a client pausing a sandbox hostd paused makes it the
   * client's). Journaled when it changes.
   */
  repause(by: PauseReason): void {
    const s = this.current;
    if (s.kind !== 'paused') throw new IllegalSandboxTransition(this.id, s.kind, 'repause');
    if (s.by === by) return;
    this.current = { ...s, by };
    this.host.save(this);
  }

  /**
   * running -> failed, when `machine` (its machine, unless it changed since) died: true if it
   * did fail now. A death reported late (the sandbox paused, merged or failed since) changes
   * nothing. Not journaled: the record still names the VM, which a restart finds gone (lost).
   */
  fail(machine: Machine, why: string): boolean {
    const s = this.current;
    if (s.kind !== 'running' || s.machine !== machine) return false;
    this.current = { kind: 'failed', machine, why };
    this.host.stopped(this, 'failed');
    return true;
  }

  /**
   * Any state but deleted -> deleted: its record goes, its id is free, waiters of its queues
   * get `err`. Returns the state it left, whose machine or files the caller destroys (a merge
   * hands the winner's machine on instead).
   */
  delete(why: string, err: HostdError): SandboxState {
    const was = this.expect('delete', 'running', 'paused', 'failed', 'lost');
    const before = this.current;
    if (before.kind === 'running') this.leaveMachine();
    this.current = { kind: 'deleted', why };
    this.host.forget(this);
    this.close(err);
    if (was !== 'lost') {
      this.host.stopped(this, 'deleted');
      this.host.expiryChanged();
    }
    return before;
  }

  /**
   * Sets its lifetime and when it ends (null: no limit); a paused sandbox keeps no end (its
   * clock starts when it runs again). Journaled.
   */
  setLifetime(lifetime: Lifetime | null, expiresAt: Date | null): void {
    this.expect('setLifetime', 'running', 'paused', 'failed');
    this.limit = lifetime;
    this.expiry = lifetime && this.current.kind !== 'paused' ? expiresAt : null;
    this.host.save(this);
    this.host.expiryChanged();
  }

  /** Notes a use now: an idle sandbox is one no request touched for a while. */
  touch(): void {
    this.lastUsed = Date.now();
  }

  info(): SandboxInfo {
    const net = this.machine?.networkStats();
    return {
      id: this.id,
      state: this.state,
      template: this.template,
      created_at: this.createdAt.toISOString(),
      last_used_at: new Date(this.lastUsed).toISOString(),
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
      merged_from: this.merges.map((m) => ({ ...m })),
      metadata: { ...this.metadata },
      timeout: this.lifetime?.timeoutS ?? null,
      on_timeout: this.lifetime?.onTimeout ?? null,
      expires_at: this.expiresAt?.toISOString() ?? null,
      paused_by: this.pausedBy,
    };
  }

  /** What the journal keeps of it (core/journal.ts). */
  record(): SandboxRecord {
    const s = this.current;
    if (s.kind === 'lost') return { ...s.record, state: 'lost', error: s.why };
    const base = {
      id: this.id,
      template: this.template,
      parent_id: this.parentId,
      snapshot_id: this.snapshotId,
      created_at: this.createdAt.toISOString(),
      allow_out: [...this.allowOut],
      ...(this.merges.length > 0 ? { merged_from: this.merges.map((m) => ({ ...m })) } : {}),
      metadata: { ...this.metadata },
      lifetime: this.lifetime
        ? { timeout_s: this.lifetime.timeoutS, on_timeout: this.lifetime.onTimeout }
        : null,
      expires_at: this.expiresAt?.toISOString() ?? null,
    };
    if (s.kind === 'paused') {
      return {
        ...base,
        state: 'paused',
        paused: s.paused.describe(),
        paused_at: s.at.toISOString(),
        paused_by: s.by,
      };
    }
    const { machine } = this;
    return machine
      ? { ...base, state: 'running', vm: machine.id, running: machine.describe() }
      : { ...base, state: 'running' };
  }

  /** Its state's kind, if it is one of `allowed`; else the transition is a bug. */
  private expect<K extends SandboxStateKind>(transition: string, ...allowed: K[]): K {
    const { kind } = this.current;
    if (!(allowed as SandboxStateKind[]).includes(kind)) {
      throw new IllegalSandboxTransition(this.id, kind, transition);
    }
    return kind as K;
  }

  /** Binds `machine` as its running one, keeping the network byte counts going. */
  private run(machine: Machine): void {
    if (this.machine !== machine) this.leaveMachine();
    this.current = { kind: 'running', machine };
  }

  /** Adds the machine it leaves to its network byte counts (a new machine counts from zero). */
  private leaveMachine(): void {
    const { machine } = this;
    if (!machine) return;
    const stats = machine.networkStats();
    this.netBefore.out += stats.bytesOut;
    this.netBefore.in += stats.bytesIn;
  }

  /** Starts its lifetime's clock (a new or resumed sandbox): it ends `timeoutS` from now. */
  private startClock(now = Date.now()): void {
    this.expiry = this.limit ? new Date(now + this.limit.timeoutS * 1000) : null;
  }
}
