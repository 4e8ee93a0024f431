/**
 * Fork and merge: the operations that create and rebind sandboxes from other sandboxes' state.
 *
 * A fork waits its turn like an exec, captures the parent (paused only while its device state
 * and written pages are copied) and restores n children, all or nothing. A merge rebinds the
 * parent id to the winner's machine; it takes its place in both sandboxes' queues at the moment
 * it arrives, so anything queued on the parent after it runs on the adopted machine, and joining
 * both queues in one synchronous step puts any two merges in the same order in every queue: no
 * deadlock.
 */
import type { Logger } from 'pino';
import { fail, failWith } from '../errors.js';
import { VmError, type FrozenState, type Hypervisor, type Machine } from '../vm/machine.js';
import type { SandboxNetwork } from './network.js';
import type { Admission } from './admission.js';
import type { ForkStandby } from './fork-standby.js';
import type { SandboxRegistry } from './registry.js';
import type { RunningSandbox, Sandbox, SandboxInfo } from './sandbox.js';
import { turns } from './each-at-once.js';
import { asMachineError, clientReason, logMachineFailure } from './machine-error.js';

export const MAX_FORK = 32;

export interface LineageDeps {
  readonly registry: SandboxRegistry;
  readonly hypervisor: Hypervisor;
  readonly admission: Admission;
  readonly standby: ForkStandby;
  readonly log: Logger;
  /** True once hostd is stopping: a fork that finishes then destroys its children. */
  readonly stopping: () => boolean;
  readonly network: SandboxNetwork;
  readonly onForked?: (n: number, seconds: number) => void;
  /**
   * How many of a fork's children run their guest at once (`restoreAll`); 0 or Infinity: all.
   */
  readonly runAtOnce: number;
}

export class Lineage {
  constructor(private readonly deps: LineageDeps) {}

  /** Forks sandbox `id` into `n` copy-on-write children, all or nothing. */
  async fork(id: string, n: number): Promise<Sandbox[]> {
    if (!Number.isInteger(n) || n < 1 || n > MAX_FORK) {
      throw fail('invalidField', 'n', `an integer from 1 to ${MAX_FORK}`, n);
    }
    const { registry, admission, standby, log } = this.deps;
    const { sandbox, release } = await registry.acquire(id, undefined, 'both');
    const started = process.hrtime.bigint();
    try {
      const { machine } = sandbox;
      const admitted = admission.admit(n);
      try {
        const target = standby.take(machine.origin, n);
        // Without a prepared target, the capture copies the parent's base image itself.
        const short = target ? null : admission.shortage(0, machine.captureCostMib());
        if (short) throw fail('insufficientResources', short);
        const state = await this.capture(sandbox, machine, n, target);
        const children = await this.restoreAll(state, n, sandbox);
        const adopted = children.map((m) =>
          registry.adopt(m, {
            template: sandbox.template,
            parentId: sandbox.id,
            snapshotId: null,
            allowOut: sandbox.allowOut,
            metadata: sandbox.metadata,
            lifetime: sandbox.lifetime,
          }),
        );
        sandbox.touch();
        const seconds = Number(process.hrtime.bigint() - started) / 1e9;
        log.info({ parent: sandbox.id, n, totalMs: Math.round(seconds * 1000) }, 'forked');
        this.deps.onForked?.(n, seconds);
        return adopted;
      } finally {
        admitted();
        standby.refillAfterFork();
      }
    } finally {
      release();
    }
  }

  /** The parent id adopts the winner's machine; the old one is destroyed; the winner id goes. */
  async merge(parentId: string, winnerId: string): Promise<SandboxInfo> {
    if (parentId === winnerId) throw fail('mergeIntoSelf');
    const { registry, log } = this.deps;
    const parent = registry.get(parentId, false);
    const winner = registry.get(winnerId, false);
    const turns = await Promise.allSettled([parent.acquireAll(), winner.acquireAll()]);
    const releases = turns.flatMap((t) => (t.status === 'fulfilled' ? [t.value] : []));
    try {
      const refused = turns.find((t): t is PromiseRejectedResult => t.status === 'rejected');
      if (refused) throw refused.reason;
      if (!registry.holds(parent)) throw fail('sandboxNotFound', parentId);
      if (!registry.holds(winner)) throw fail('sandboxNotFound', winnerId);
      if (winner.brokenReason) throw fail('sandboxBroken', winnerId, winner.brokenReason);
      await registry.wake(winner); // a paused winner runs again first
      if (!winner.isRunning())
        throw fail('sandboxBroken', winnerId, winner.brokenReason ?? 'its VM failed');
      const taken = {
        id: winner.id,
        machine: winner.machine,
        template: winner.template,
        allowOut: winner.allowOut,
      };
      // The winner's record goes before the parent's is rewritten: a restart must never find
      // two sandboxes on one VM. Its machine is handed on, not destroyed.
      winner.delete(`merged into ${parent.id}`, fail('sandboxMergedAway', winner.id, parent.id));
      const old = parent.status;
      parent.adoptMerged(taken);
      registry.watchMachine(parent);
      parent.touch();
      log.info({ parent: parent.id, winner: winner.id }, 'merged');
      if (old.kind === 'running' || old.kind === 'failed') {
        void old.machine.destroy('the sandbox adopted another VM by merge');
      }
      if (old.kind === 'paused') void old.paused.discard();
      return parent.info();
    } finally {
      releases.forEach((r) => r());
    }
  }

  private async capture(
    sandbox: RunningSandbox,
    machine: Machine,
    n: number,
    target: Parameters<Machine['capture']>[1],
  ): Promise<FrozenState> {
    try {
      return await machine.capture(n, target);
    } catch (err) {
      if (!this.deps.registry.holds(sandbox)) throw fail('sandboxDeleted', sandbox.id);
      throw asMachineError(
        err,
        this.deps.log,
        { sandbox: sandbox.id },
        'vmOperationFailed',
        'capture the parent state',
      );
    }
  }

  /**
   * Restores `n` machines from `state` with the parent's network rules, or none: on any failure
   * the others are destroyed. Every child's QEMU and disk are readied at once, but at most
   * `runAtOnce` guests run at a time, the next as one answers its hello (docs/architecture.md,
   * "Where a fork child's time goes"): under TCG a restored guest's CPU grows with the time it
   * spends beside the others (all 32 at once, each ran for most of the fork), and on a 2-core
   * host 32 runnable guests also crowd out hostd's own steps for the children.
   */
  private async restoreAll(state: FrozenState, n: number, parent: Sandbox): Promise<Machine[]> {
    const { allowOut } = parent;
    const { hypervisor, stopping, log, network } = this.deps;
    const take = turns(this.deps.runAtOnce);
    // The first child that failed, in time: the fork is lost from then on (all or nothing), so a
    // child still waiting for its turn gives up then, as it does once hostd stops, rather than
    // run its guest to be destroyed: with every guest failing its hello, a fork of 32 four at a
    // time would otherwise take eight hello timeouts to fail, the parent's queue (and hostd's
    // stop) held all along.
    let failure: { reason: unknown } | null = null;
    let gaveUp = 0;
    const restoreOne = async (): Promise<Machine> => {
      const held: { end: (() => void) | null; gaveUp: boolean } = { end: null, gaveUp: false };
      const turn = async (): Promise<void> => {
        held.end = await take();
        if (failure || stopping()) {
          held.gaveUp = true;
          throw new VmError('start_failed', 'another child of the fork failed, or hostd stops', {
            operation: 'restore',
          });
        }
        // Ended below once the restore has settled, not at the hello: ended inside the VM, a
        // failed child's turn would pass on before its restore rejects, and the next child
        // would run its guest before the failure is known here.
      };
      try {
        let machine: Machine;
        try {
          machine = await hypervisor.restore(state, turn);
        } finally {
          held.end?.();
        }
        try {
          await network.bind(machine, allowOut);
        } catch (err) {
          await machine.destroy();
          throw err;
        }
        return machine;
      } catch (err) {
        if (held.gaveUp) gaveUp++;
        else failure ??= { reason: err };
        throw err;
      }
    };
    // Each child holds its own reference to the state; the capture's goes when all are started.
    const results = await Promise.allSettled(Array.from({ length: n }, restoreOne)).finally(() => {
      state.release();
      void state.discardPrepared();
    });
    const machines = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    if (failure || stopping()) {
      await Promise.all(machines.map((m) => m.destroy()));
      if (stopping() || !failure) throw fail('shuttingDown');
      const { reason } = failure;
      logMachineFailure(log, reason, { sandbox: parent.id }, 'start a fork child');
      const why = clientReason(reason);
      throw failWith(reason, 'forkChildrenFailed', n - machines.length - gaveUp, n, why);
    }
    return machines;
  }
}
