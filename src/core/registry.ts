/**
 * The sandboxes that exist, and the rules every operation on one follows: ids are validated
 * before they touch anything, a sandbox whose machine died answers with that reason, and an
 * operation that waited its turn re-checks the sandbox still exists when it gets it.
 */
import type { Logger } from 'pino';
import { fail, type HostdError } from '../errors.js';
import type { Machine } from '../vm/machine.js';
import { isSandboxId, newSandboxId } from './ids.js';
import { noJournal, type SandboxJournal } from './journal.js';
import { Sandbox } from './sandbox.js';
import type { Release } from './serial-queue.js';

export class SandboxRegistry {
  private readonly sandboxes = new Map<string, Sandbox>();

  constructor(
    private readonly log: Logger,
    private readonly maxQueued: number,
    private readonly journal: SandboxJournal = noJournal,
  ) {}

  get size(): number {
    return this.sandboxes.size;
  }

  all(): Sandbox[] {
    return [...this.sandboxes.values()];
  }

  /** True while `sandbox` is still the one registered under its id. */
  holds(sandbox: Sandbox): boolean {
    return this.sandboxes.get(sandbox.id) === sandbox;
  }

  /** Registers a new sandbox driving `machine`. */
  adopt(machine: Machine, template: string, parentId: string | null): Sandbox {
    const sandbox = new Sandbox(newSandboxId(), template, machine, parentId, this.maxQueued);
    this.sandboxes.set(sandbox.id, sandbox);
    this.watch(sandbox);
    this.record(sandbox);
    this.log.info(
      { sandbox: sandbox.id, vm: machine.id, template, parent: parentId },
      'sandbox ready',
    );
    return sandbox;
  }

  /** Unregisters it; its queue's waiters get `why`. */
  remove(sandbox: Sandbox, why: HostdError): void {
    if (this.holds(sandbox)) {
      this.sandboxes.delete(sandbox.id);
      this.journal.remove(sandbox.id);
    }
    sandbox.queue.close(why);
  }

  /** Points `sandbox` at another machine (merge) and watches that one instead. */
  rebind(sandbox: Sandbox, machine: Machine, template: string): void {
    sandbox.machine = machine;
    sandbox.template = template;
    sandbox.brokenReason = null;
    this.watch(sandbox);
    this.record(sandbox);
  }

  /** The sandbox `id`; with `usable`, one whose machine still works (else 500 with why). */
  get(id: string, usable: boolean): Sandbox {
    const sandbox = isSandboxId(id) ? this.sandboxes.get(id) : undefined;
    if (!sandbox) throw fail('sandboxNotFound', id);
    if (usable) this.ensureUsable(sandbox);
    sandbox.touch();
    return sandbox;
  }

  /**
   * Waits for the sandbox's turn (its queue), then re-checks it: it may have been deleted,
   * merged away or broken meanwhile.
   */
  async acquire(
    id: string,
    signal?: AbortSignal,
    usable = true,
  ): Promise<{ sandbox: Sandbox; release: Release }> {
    const sandbox = this.get(id, usable);
    const release = await sandbox.queue.acquire(signal);
    try {
      if (!this.holds(sandbox)) throw fail('sandboxNotFound', id);
      if (usable) this.ensureUsable(sandbox);
    } catch (err) {
      release();
      throw err;
    }
    return { sandbox, release };
  }

  /**
   * Marks the sandbox failed because `machine` (its machine, unless it has changed since) died
   * or stopped answering, and destroys that machine. Later operations but delete report it.
   */
  markBroken(sandbox: Sandbox, machine: Machine, why: string): void {
    if (sandbox.machine !== machine || sandbox.brokenReason) return;
    sandbox.brokenReason = why;
    this.log.warn({ sandbox: sandbox.id, vm: machine.id, why }, 'sandbox VM failed');
    void machine
      .logTail()
      .then((tail) => this.log.warn({ sandbox: sandbox.id, tail }, 'VM log tail'));
    void machine.destroy();
  }

  private ensureUsable(sandbox: Sandbox): void {
    // The machine may be gone before its death was reported (the channel closes a moment
    // before QEMU's exit is seen): judge by its state, not only by events.
    const { machine } = sandbox;
    if (!sandbox.brokenReason && !machine.alive) {
      this.markBroken(sandbox, machine, machine.deathReason);
    }
    if (sandbox.brokenReason) throw fail('sandboxBroken', sandbox.id, sandbox.brokenReason);
  }

  private record(sandbox: Sandbox): void {
    try {
      this.journal.write({
        id: sandbox.id,
        template: sandbox.template,
        parent_id: sandbox.parentId,
        created_at: sandbox.createdAt.toISOString(),
        vm: sandbox.machine.id,
      });
    } catch (err) {
      this.log.error({ err, sandbox: sandbox.id }, 'could not write the sandbox record');
    }
  }

  private watch(sandbox: Sandbox): void {
    const { machine } = sandbox;
    machine.onDeath((why) => this.markBroken(sandbox, machine, why));
    // It may have died before anyone listened (a fork child waiting for its siblings).
    if (!machine.alive) this.markBroken(sandbox, machine, machine.deathReason);
  }
}
