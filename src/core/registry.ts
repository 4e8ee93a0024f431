/**
 * The sandboxes that exist, and the rules every operation on one follows: ids are validated
 * before they touch anything, a sandbox whose machine died answers with that reason, a paused
 * sandbox is resumed by the first operation that needs it running, and an operation that waited
 * its turn re-checks the sandbox still exists when it gets it. Every change is written to the
 * journal (core/journal.ts).
 */
import type { Logger } from 'pino';
import { fail, type HostdError } from '../errors.js';
import type { Hypervisor, Machine } from '../vm/machine.js';
import { isSandboxId, newSandboxId } from './ids.js';
import { memoryRecords, type RecordStore, type SandboxRecord } from './journal.js';
import { asMachineError } from './machine-error.js';
import { Sandbox, type Lifetime, type PauseReason, type SandboxOrigin } from './sandbox.js';
import type { Release } from './serial-queue.js';

/** A sandbox whose machine is running, as an operation that holds its turn sees it. */
export type RunningSandbox = Sandbox & { machine: Machine };

/** Why a sandbox stopped running: deleted (merged away, expired), paused, or its VM failed. */
export type StopReason = 'deleted' | 'paused' | 'failed';
/** Told when a sandbox stops running, after the fact; must not throw (errors are ignored). */
export type StopListener = (id: string, why: StopReason) => void;

export class SandboxRegistry {
  private readonly sandboxes = new Map<string, Sandbox>();
  /** Sandboxes whose VM died while hostd was not running: id -> why. */
  private readonly lost = new Map<string, string>();
  private readonly stopListeners = new Set<StopListener>();
  /** Called whenever a sandbox's `expiresAt` may have changed (core/lifetimes.ts re-arms). */
  onExpiryChange: () => void = () => undefined;

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

  get size(): number {
    return this.sandboxes.size;
  }

  /** Sandboxes with a running machine (admission counts these). */
  get running(): number {
    let n = 0;
    for (const s of this.sandboxes.values()) if (!s.paused) n++;
    return n;
  }

  all(): Sandbox[] {
    return [...this.sandboxes.values()];
  }

  /** True when `id` is registered (running or paused) or remembered as lost. */
  has(id: string): boolean {
    return this.sandboxes.has(id) || this.lost.has(id);
  }

  /** True while `sandbox` is still the one registered under its id. */
  holds(sandbox: Sandbox): boolean {
    return this.sandboxes.get(sandbox.id) === sandbox;
  }

  /** Registers a new sandbox driving `machine`. */
  adopt(machine: Machine, origin: SandboxOrigin): RunningSandbox {
    const sandbox = new Sandbox(newSandboxId(), origin, machine, this.maxQueued);
    sandbox.startClock();
    this.sandboxes.set(sandbox.id, sandbox);
    this.watch(sandbox, machine);
    this.save(sandbox);
    this.onExpiryChange();
    this.log.info(
      { sandbox: sandbox.id, vm: machine.id, template: origin.template, parent: origin.parentId },
      'sandbox ready',
    );
    return sandbox as RunningSandbox;
  }

  /** Registers a sandbox read back from the journal after a restart. */
  readmit(sandbox: Sandbox): void {
    this.sandboxes.set(sandbox.id, sandbox);
    if (sandbox.machine) this.watch(sandbox, sandbox.machine);
    this.save(sandbox);
    this.onExpiryChange();
  }

  /** Remembers a sandbox lost while hostd was down: its id answers `sandbox_lost` until deleted. */
  markLost(record: SandboxRecord, why: string): void {
    this.lost.set(record.id, why);
    this.journal.write({ ...record, state: 'lost', error: why });
  }

  /** Unregisters it; its queue's waiters get `why`. */
  remove(sandbox: Sandbox, why: HostdError): void {
    const held = this.holds(sandbox);
    if (held) {
      this.sandboxes.delete(sandbox.id);
      this.journal.remove(sandbox.id);
    }
    sandbox.close(why);
    if (held) {
      this.stopped(sandbox.id, 'deleted');
      this.onExpiryChange();
    }
  }

  /** Forgets a lost sandbox; true if `id` was one. */
  forgetLost(id: string): boolean {
    if (!this.lost.delete(id)) return false;
    this.journal.remove(id);
    return true;
  }

  /** Points `sandbox` at another running machine (merge, resume) and watches that one. */
  rebind(sandbox: Sandbox, machine: Machine, template = sandbox.template): void {
    // A paused sandbox that runs again gets its whole lifetime again.
    if (sandbox.paused) sandbox.startClock();
    sandbox.setMachine(machine);
    sandbox.template = template;
    sandbox.brokenReason = null;
    sandbox.paused = null;
    sandbox.pausedAt = null;
    sandbox.pausedBy = null;
    this.watch(sandbox, machine);
    this.save(sandbox);
    this.onExpiryChange();
  }

  /** Records that `sandbox` is now on disk (its machine stopped): its lifetime's clock stops. */
  markPaused(
    sandbox: Sandbox,
    paused: NonNullable<Sandbox['paused']>,
    by: PauseReason = 'request',
  ): void {
    sandbox.setMachine(null);
    sandbox.paused = paused;
    sandbox.pausedAt = new Date();
    sandbox.pausedBy = by;
    sandbox.expiresAt = null;
    this.save(sandbox);
    this.stopped(sandbox.id, 'paused');
    this.onExpiryChange();
  }

  /** Records who paused a paused sandbox (a client pausing one hostd paused). */
  setPausedBy(sandbox: Sandbox, by: PauseReason): void {
    if (!sandbox.paused || sandbox.pausedBy === by) return;
    sandbox.pausedBy = by;
    this.save(sandbox);
  }

  /**
   * Sets the sandbox's lifetime and when it ends (null: no limit); a paused sandbox keeps no
   * end (its clock starts when it runs again).
   */
  setLifetime(sandbox: Sandbox, lifetime: Lifetime | null, expiresAt: Date | null): void {
    sandbox.lifetime = lifetime;
    sandbox.expiresAt = lifetime && !sandbox.paused ? expiresAt : null;
    this.save(sandbox);
    this.onExpiryChange();
  }

  /**
   * The sandbox `id`. With `usable`, it must not have failed (else 500 with why); a paused one
   * is usable (the operation resumes it once it has its turn).
   */
  get(id: string, usable: boolean): Sandbox {
    const sandbox = isSandboxId(id) ? this.sandboxes.get(id) : undefined;
    if (!sandbox) {
      const why = this.lost.get(id);
      throw why === undefined ? fail('sandboxNotFound', id) : fail('sandboxLost', id, why);
    }
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
    } catch (err) {
      release();
      throw err;
    }
    return { sandbox: sandbox as RunningSandbox, release };
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
      if (!sandbox.paused) return { sandbox: sandbox as RunningSandbox, release };
      release(); // paused again before its turn came: resume it again
    }
  }

  /** Resumes `sandbox` if it is paused; its caller holds its turn. */
  async wake(sandbox: Sandbox): Promise<void> {
    const { paused } = sandbox;
    if (!paused || sandbox.brokenReason) return;
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
    this.rebind(sandbox, machine);
    this.log.info({ sandbox: sandbox.id, vm: machine.id }, 'sandbox resumed');
  }

  /**
   * Marks the sandbox failed because `machine` (its machine, unless it has changed since) died
   * or stopped answering, and destroys that machine. Later operations but delete report it.
   */
  markBroken(sandbox: Sandbox, machine: Machine, why: string): void {
    if (sandbox.machine !== machine || sandbox.brokenReason) return;
    sandbox.brokenReason = why;
    this.log.warn({ sandbox: sandbox.id, vm: machine.id, why }, 'sandbox VM failed');
    this.stopped(sandbox.id, 'failed');
    void machine.logTail().then(
      (tail) => this.log.warn({ sandbox: sandbox.id, tail }, 'VM log tail'),
      (err: unknown) => this.log.warn({ sandbox: sandbox.id, err }, 'no VM log tail'),
    );
    void machine.destroy();
  }

  private ensureUsable(sandbox: Sandbox): void {
    // The machine may be gone before its death was reported (the channel closes a moment
    // before QEMU's exit is seen): judge by its state, not only by events.
    const { machine } = sandbox;
    if (machine && !sandbox.brokenReason && !machine.alive) {
      this.markBroken(sandbox, machine, machine.deathReason);
    }
    if (sandbox.brokenReason) throw fail('sandboxBroken', sandbox.id, sandbox.brokenReason);
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
