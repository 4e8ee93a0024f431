/**
 * The sandboxes that exist, and the rules every operation on one follows: ids are validated
 * before they touch anything, a sandbox whose machine died answers with that reason, a paused
 * sandbox is resumed by the first operation that needs it running, and an operation that waited
 * its turn re-checks the sandbox still exists when it gets it. It looks sandboxes up and keeps
 * the index; a sandbox changes its own state (core/sandbox.ts), and through the registry (its
 * `SandboxHost`) writes the journal (core/journal.ts) and tells stop listeners.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import type { Hypervisor, Machine } from '../vm/machine.js';
import { isSandboxId, newSandboxId } from './ids.js';
import { memoryRecords, type RecordStore, type SandboxRecord } from './journal.js';
import { asMachineError } from './machine-error.js';
import {
  IllegalSandboxTransition,
  Sandbox,
  type InitialState,
  type MergeRecord,
  type RunningSandbox,
  type SandboxHost,
  type SandboxOrigin,
  type StopReason,
} from './sandbox.js';
import type { Release } from './serial-queue.js';

export type { RunningSandbox, StopReason } from './sandbox.js';
/** Told when a sandbox stops running, after the fact; must not throw (errors are ignored). */
export type StopListener = (id: string, why: StopReason) => void;

export class SandboxRegistry {
  /** Every sandbox this hostd holds: running, paused, failed, and lost (until deleted). */
  private readonly sandboxes = new Map<string, Sandbox>();
  private readonly stopListeners = new Set<StopListener>();
  /** Called whenever a sandbox's `expiresAt` may have changed (core/lifetimes.ts re-arms). */
  onExpiryChange: () => void = () => undefined;
  /** What every sandbox's transitions call (core/sandbox.ts, `SandboxHost`). */
  private readonly host: SandboxHost = {
    save: (sandbox) => this.save(sandbox),
    forget: (sandbox) => {
      if (this.holds(sandbox)) {
        this.sandboxes.delete(sandbox.id);
        this.journal.remove(sandbox.id);
      }
    },
    stopped: (sandbox, why) => this.stopped(sandbox.id, why),
    expiryChanged: () => this.onExpiryChange(),
  };

  constructor(
    private readonly log: Logger,
    private readonly maxQueued: number,
    private readonly hypervisor: Hypervisor,
    /** Applies a sandbox's egress rules to a machine it is about to drive (core/network.ts). */
    private readonly bindNetwork: (machine: Machine, allowOut: readonly string[]) => Promise<void>,
    private readonly journal: RecordStore<SandboxRecord> = memoryRecords(),
  ) {}

  /**
   * Calls `listener` whenever a sandbox stops running, however it stopped (an API call, the
   * reaper, a merge, a dying VM): what holds a connection open for one (the E2B front's
   * streams) ends it. Returns the unsubscribe function.
   */
  onStopped(listener: StopListener): () => void {
    this.stopListeners.add(listener);
    return () => this.stopListeners.delete(listener);
  }

  private stopped(id: string, why: StopReason): void {
    for (const listener of this.stopListeners) {
      try {
        listener(id, why);
      } catch (err) {
        this.log.error({ err, sandbox: id }, 'a sandbox stop listener failed');
      }
    }
  }

  /** Sandboxes held (running, paused or failed; not the lost). */
  get size(): number {
    return this.all().length;
  }

  /** Sandboxes with a running machine (admission counts these). */
  get running(): number {
    let n = 0;
    for (const s of this.all()) if (!s.paused) n++;
    return n;
  }

  /** Sandboxes held (running, paused or failed); lost ones only answer their id. */
  all(): Sandbox[] {
    return [...this.sandboxes.values()].filter((s) => s.status.kind !== 'lost');
  }

  /** True when `id` is registered (running, paused or failed) or remembered as lost. */
  has(id: string): boolean {
    return this.sandboxes.has(id);
  }

  /** True while `sandbox` is still the one registered under its id. */
  holds(sandbox: Sandbox): boolean {
    return this.sandboxes.get(sandbox.id) === sandbox;
  }

  /**
   * Registers a new sandbox driving `machine`. It is failed already if the machine died before
   * this (a fork child waiting for its siblings).
   */
  adopt(machine: Machine, origin: SandboxOrigin): Sandbox {
    const sandbox = this.admit(newSandboxId(), origin, { kind: 'running', machine });
    this.log.info(
      { sandbox: sandbox.id, vm: machine.id, template: origin.template, parent: origin.parentId },
      'sandbox ready',
    );
    return sandbox;
  }

  /**
   * Registers a sandbox read back from the journal after a restart, as it was (`initial`:
   * paused, running on its re-adopted VM); its record is rewritten.
   */
  readmit(
    record: SandboxRecord,
    origin: SandboxOrigin,
    initial: Exclude<InitialState, { kind: 'lost' }>,
  ): Sandbox {
    return this.admit(record.id, origin, initial, record);
  }

  /** Remembers a sandbox lost while hostd was down: its id answers `sandbox_lost` until deleted. */
  markLost(record: SandboxRecord, why: string): void {
    const origin = {
      template: record.template,
      parentId: record.parent_id,
      snapshotId: record.snapshot_id,
    };
    this.admit(record.id, origin, { kind: 'lost', why, record }, record);
  }

  private admit(
    id: string,
    origin: SandboxOrigin,
    initial: InitialState,
    record?: SandboxRecord,
  ): Sandbox {
    const merged: readonly MergeRecord[] = record?.merged_from ?? [];
    const createdAt = record ? new Date(record.created_at) : new Date();
    const sandbox = new Sandbox(id, origin, initial, this.maxQueued, this.host, createdAt, merged);
    this.sandboxes.set(id, sandbox);
    if (sandbox.machine) this.watch(sandbox, sandbox.machine);
    this.save(sandbox);
    this.onExpiryChange();
    return sandbox;
  }

  /** Forgets a lost sandbox; true if `id` was one. */
  forgetLost(id: string): boolean {
    const sandbox = this.sandboxes.get(id);
    if (sandbox?.status.kind !== 'lost') return false;
    sandbox.delete(sandbox.status.why, fail('sandboxDeleted', id));
    return true;
  }

  /**
   * The sandbox `id`. With `usable`, it must not have failed (else 500 with why); a paused one
   * is usable (the operation resumes it once it has its turn).
   */
  get(id: string, usable: boolean): Sandbox {
    const sandbox = isSandboxId(id) ? this.sandboxes.get(id) : undefined;
    if (!sandbox) throw fail('sandboxNotFound', id);
    if (sandbox.status.kind === 'lost') throw fail('sandboxLost', id, sandbox.status.why);
    if (usable) this.ensureUsable(sandbox);
    sandbox.touch();
    return sandbox;
  }

  /**
   * Waits for the sandbox's turn (its queue), then re-checks it: it may have been deleted,
   * merged away or broken meanwhile. A paused sandbox is resumed first.
   */
  async acquire(
    id: string,
    signal?: AbortSignal,
    lanes: 'exec' | 'both' = 'exec',
  ): Promise<{ sandbox: RunningSandbox; release: Release }> {
    const sandbox = this.get(id, true);
    const release = await (lanes === 'both'
      ? sandbox.acquireAll(signal)
      : sandbox.queue.acquire(signal));
    try {
      if (!this.holds(sandbox)) throw fail('sandboxNotFound', id);
      await this.wake(sandbox);
      this.ensureUsable(sandbox);
      if (!sandbox.isRunning()) {
        throw new IllegalSandboxTransition(id, sandbox.status.kind, 'acquire');
      }
      return { sandbox, release };
    } catch (err) {
      release();
      throw err;
    }
  }

  /**
   * Waits for the sandbox's file lane (docs/api.md, Files: "Ordering"): not behind its execs. A
   * paused sandbox is resumed first, in its exec lane, as any operation that needs it running.
   */
  async acquireFiles(
    id: string,
    signal?: AbortSignal,
  ): Promise<{ sandbox: RunningSandbox; release: Release }> {
    for (;;) {
      const sandbox = this.get(id, true);
      if (sandbox.paused) (await this.acquire(id, signal)).release();
      const release = await sandbox.fileQueue.acquire(signal);
      try {
        if (!this.holds(sandbox)) throw fail('sandboxNotFound', id);
        this.ensureUsable(sandbox);
      } catch (err) {
        release();
        throw err;
      }
      // Pausing takes this lane too, so a sandbox running now stays running until release.
      if (sandbox.isRunning()) return { sandbox, release };
      release(); // paused again before its turn came: resume it again
    }
  }

  /** Resumes `sandbox` if it is paused; its caller holds its turn. */
  async wake(sandbox: Sandbox): Promise<void> {
    const { paused } = sandbox;
    if (!paused) return;
    let machine: Machine;
    try {
      machine = await this.hypervisor.resume(paused);
    } catch (err) {
      const context = { sandbox: sandbox.id };
      throw asMachineError(err, this.log, context, 'vmOperationFailed', 'resume the sandbox');
    }
    try {
      await this.bindNetwork(machine, sandbox.allowOut);
    } catch (err) {
      // The paused files are gone with the resume: the sandbox runs on, without network.
      this.log.error({ err, sandbox: sandbox.id }, 'could not set up the network after resume');
    }
    sandbox.resume(machine);
    this.watch(sandbox, machine);
    this.log.info({ sandbox: sandbox.id, vm: machine.id }, 'sandbox resumed');
  }

  /** Watches the machine a merge bound to `sandbox` (core/lineage.ts): its death fails it. */
  watchMachine(sandbox: Sandbox): void {
    const { machine } = sandbox;
    if (machine) this.watch(sandbox, machine);
  }

  /**
   * Marks the sandbox failed because `machine` (its machine, unless it has changed since) died
   * or stopped answering, and destroys that machine. Later operations but delete report it.
   */
  markBroken(sandbox: Sandbox, machine: Machine, why: string): void {
    if (!sandbox.fail(machine, why)) return;
    this.log.warn({ sandbox: sandbox.id, vm: machine.id, why }, 'sandbox VM failed');
    void machine.logTail().then(
      (tail) => this.log.warn({ sandbox: sandbox.id, tail }, 'VM log tail'),
      (err: unknown) => this.log.warn({ sandbox: sandbox.id, err }, 'no VM log tail'),
    );
    void machine.destroy();
  }

  private ensureUsable(sandbox: Sandbox): void {
    // The machine may be gone before its death was reported (the channel closes a moment
    // before QEMU's exit is seen): judge by its state, not only by events.
    const s = sandbox.status;
    if (s.kind === 'running' && !s.machine.alive) {
      this.markBroken(sandbox, s.machine, s.machine.deathReason);
    }
    if (sandbox.brokenReason) throw fail('sandboxBroken', sandbox.id, sandbox.brokenReason);
  }

  /**
   * Resolves once the records written so far that must outlive the host (paused sandboxes) are
   * on disk under their names. Like a record's write, a failure is logged, not thrown.
   */
  async flushRecords(): Promise<void> {
    try {
      await this.journal.flush();
    } catch (err) {
      this.log.error({ err }, 'could not sync the sandbox records');
    }
  }

  private save(sandbox: Sandbox): void {
    try {
      this.journal.write(sandbox.record());
    } catch (err) {
      this.log.error({ err, sandbox: sandbox.id }, 'could not write the sandbox record');
    }
  }

  private watch(sandbox: Sandbox, machine: Machine): void {
    machine.onDeath((why) => this.markBroken(sandbox, machine, why));
    // It may have died before anyone listened (a fork child waiting for its siblings).
    if (!machine.alive) this.markBroken(sandbox, machine, machine.deathReason);
  }
}
