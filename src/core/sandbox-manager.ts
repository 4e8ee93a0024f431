/**
 * Owns every sandbox: create from a pool, exec through a per-sandbox FIFO, fork into
 * copy-on-write children, merge a winner into its parent, delete, reap idle ones, shut down.
 * It speaks in typed errors and async iterables; it knows nothing of HTTP.
 */
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { Errors, fail, failWith, HostdError } from '../errors.js';
import type { Language } from '../vm/agent-channel.js';
import type { MachineSpec } from '../vm/qemu-args.js';
import { Vm, VmError, type VmHost } from '../vm/vm.js';
import { ExecRun } from './exec-run.js';
import { isSandboxId, newSandboxId } from './ids.js';
import { hostFree, shortage } from '../vm/host-resources.js';
import { TemplatePool, type PoolStats } from './pool.js';
import { Sandbox, type SandboxInfo } from './sandbox.js';
import type { Release } from './serial-queue.js';

/** Hooks for metrics; the api layer wires them to prom-client. */
export interface ManagerObserver {
  execStarted?(): void;
  execFinished?(seconds: number): void;
  forked?(n: number, seconds: number): void;
  created?(hit: boolean, seconds: number): void;
  vmStartFailed?(): void;
}

export interface ExecRequest {
  code: string;
  language: Language;
  timeoutMs?: number;
  signal?: AbortSignal;
}

export const MAX_FORK = 32;

type DropLast<T extends unknown[]> = T extends [...infer H, unknown] ? H : never;

const secondsSince = (start: bigint): number => Number(process.hrtime.bigint() - start) / 1e9;

export class SandboxManager {
  private readonly sandboxes = new Map<string, Sandbox>();
  private readonly pools = new Map<string, TemplatePool>();
  private shuttingDown = false;
  private reaper: NodeJS.Timeout | undefined;
  /** Children being started by forks in flight; counted against maxSandboxes. */
  private reserved = 0;

  constructor(
    private readonly config: Config,
    private readonly host: VmHost,
    private readonly specFor: (template: string) => MachineSpec,
    private readonly log: Logger,
    private readonly observer: ManagerObserver = {},
  ) {}

  /** Boots every template (in turn: they compete for the same CPUs) and starts the reaper. */
  async start(): Promise<void> {
    this.host.spares?.limitBy((vms, imageMib) => this.resourceShortage(vms, imageMib));
    for (const t of this.config.templates) {
      const pool = new TemplatePool(
        t,
        this.host,
        this.specFor(t.name),
        join(this.config.stateDir, 'images', `template-${t.name}.mem`),
        this.log,
        () => this.observer.vmStartFailed?.(),
        () => this.resourceShortage(1, 0),
      );
      this.pools.set(t.name, pool);
      await pool.init();
    }
    if (this.config.idleTimeoutS > 0) {
      const every = Math.min(30_000, this.config.idleTimeoutS * 500);
      this.reaper = setInterval(() => void this.reapIdle(), every);
      this.reaper.unref();
    }
  }

  templateBootMs(template = this.config.defaultTemplate): number {
    return this.pools.get(template)?.bootMs ?? 0;
  }

  poolStats(): PoolStats[] {
    return [...this.pools.values()].map((p) => p.stats());
  }

  /** QEMUs started ahead for forks, and whether more are being started (vm/spare-copies.ts). */
  forkStandby(): { vms: number; filling: boolean } {
    const spares = this.host.spares;
    return { vms: spares?.standingBy ?? 0, filling: spares?.filling ?? false };
  }

  get count(): number {
    return this.sandboxes.size;
  }

  list(): SandboxInfo[] {
    return [...this.sandboxes.values()].map((s) => s.info());
  }

  describe(id: string): SandboxInfo {
    return this.get(id, true).info();
  }

  async create(template: string | undefined): Promise<Sandbox> {
    this.ensureRunning();
    const name = template ?? this.config.defaultTemplate;
    const pool = this.pools.get(name);
    if (!pool) {
      throw fail('templateNotFound', name, [...this.pools.keys()]);
    }
    this.ensureCapacity(1);
    this.ensureResources(1, 0);
    const started = process.hrtime.bigint();
    this.reserved++;
    let taken: { vm: Vm; hit: boolean };
    try {
      taken = await pool.take();
    } catch (err) {
      throw this.vmError(err, 'vmStartFailed');
    } finally {
      this.reserved--;
    }
    if (this.shuttingDown) {
      await taken.vm.destroy();
      throw fail('shuttingDown');
    }
    const sandbox = this.adopt(taken.vm, name, null);
    this.observer.created?.(taken.hit, secondsSince(started));
    return sandbox;
  }

  /**
   * Waits for the sandbox's turn, then starts the exec and returns its event stream. The turn
   * is held until the exec has finished on the VM, whatever the consumer does.
   */
  async exec(id: string, req: ExecRequest): Promise<ExecRun> {
    const { sandbox, release } = await this.acquire(id, req.signal);
    const started = process.hrtime.bigint();
    let run: ExecRun;
    try {
      const { vm } = sandbox;
      run = new ExecRun(vm, { ...req, maxOutputBytes: this.config.maxExecOutputBytes }, (why) =>
        this.markBroken(sandbox, vm, why),
      );
    } catch (err) {
      release();
      throw this.vmError(err, 'vmOperationFailed', 'start the exec');
    }
    this.observer.execStarted?.();
    void run.done.then(() => {
      sandbox.touch();
      release();
      this.observer.execFinished?.(secondsSince(started));
    });
    return run;
  }

  /**
   * Forks `id` into n copy-on-write children, all or nothing. Waits its turn like an exec;
   * the parent pauses only while its device state and written pages are copied.
   */
  async fork(id: string, n: number): Promise<Sandbox[]> {
    if (!Number.isInteger(n) || n < 1 || n > MAX_FORK) {
      throw fail('invalidField', 'n', `an integer from 1 to ${MAX_FORK}`, n);
    }
    const { sandbox, release } = await this.acquire(id);
    const started = process.hrtime.bigint();
    const memPath = join(
      this.config.stateDir,
      'images',
      `fork-${randomBytes(8).toString('hex')}.mem`,
    );
    try {
      this.ensureCapacity(n);
      this.ensureResources(n, sandbox.vm.imageMib());
      this.reserved += n;
      try {
        const snapshot = await sandbox.vm.snapshot(memPath, n).catch((err: unknown) => {
          if (this.sandboxes.get(id) !== sandbox) throw fail('sandboxDeleted', id);
          throw this.vmError(err, 'vmOperationFailed', 'capture the parent state');
        });
        const snapshotMs = secondsSince(started) * 1000;
        // Each child holds its own reference to the fork image; the last to go deletes it.
        const results = await Promise.allSettled(
          Array.from({ length: n }, () => Vm.restore(this.host, snapshot)),
        ).finally(() => {
          snapshot.image.release();
          for (const vm of snapshot.standby?.splice(0) ?? []) void vm.destroy();
        });
        const vms = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
        const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
        if (failure || this.shuttingDown) {
          await Promise.all(vms.map((vm) => vm.destroy()));
          if (this.shuttingDown) throw fail('shuttingDown');
          const failed = results.length - vms.length;
          throw this.vmError(failure!.reason, 'forkChildrenFailed', failed, n);
        }
        const children = vms.map((vm) => this.adopt(vm, sandbox.template, sandbox.id));
        sandbox.touch();
        const totalMs = secondsSince(started) * 1000;
        this.log.info(
          {
            parent: sandbox.id,
            n,
            snapshotMs: Math.round(snapshotMs),
            totalMs: Math.round(totalMs),
          },
          'forked',
        );
        this.observer.forked?.(n, secondsSince(started));
        return children;
      } finally {
        this.reserved -= n;
        this.host.spares?.refill();
      }
    } finally {
      release();
    }
  }

  /**
   * The parent id adopts the winner's VM; the parent's old VM is destroyed and the winner id
   * disappears. Merge takes its place in both sandboxes' queues at the moment it arrives, so
   * anything queued on the parent after it runs on the adopted VM. Joining both queues in one
   * synchronous step puts any two merges in the same order in every queue: no deadlock.
   */
  async merge(parentId: string, winnerId: string): Promise<SandboxInfo> {
    if (parentId === winnerId) {
      throw fail('mergeIntoSelf');
    }
    this.ensureRunning();
    const parent = this.get(parentId, true);
    const winner = this.get(winnerId, true);
    const turns = await Promise.allSettled([parent.queue.acquire(), winner.queue.acquire()]);
    const releases = turns.flatMap((t) => (t.status === 'fulfilled' ? [t.value] : []));
    const releaseAll = (): void => releases.forEach((r) => r());
    const refused = turns.find((t): t is PromiseRejectedResult => t.status === 'rejected');
    if (refused) {
      releaseAll();
      throw refused.reason;
    }
    if (this.sandboxes.get(parentId) !== parent || this.sandboxes.get(winnerId) !== winner) {
      releaseAll();
      throw fail('sandboxNotFound', this.sandboxes.has(parentId) ? winnerId : parentId);
    }
    try {
      if (winner.brokenReason) {
        throw fail('sandboxBroken', winnerId, winner.brokenReason);
      }
      const oldVm = parent.vm;
      this.sandboxes.delete(winner.id);
      winner.queue.close(fail('sandboxMergedAway', winner.id, parent.id));
      parent.vm = winner.vm;
      parent.template = winner.template;
      parent.brokenReason = null;
      this.watchVm(parent, winner.vm);
      parent.touch();
      this.log.info({ parent: parent.id, winner: winner.id }, 'merged');
      void oldVm.destroy('the sandbox adopted another VM by merge');
      return parent.info();
    } finally {
      releaseAll();
    }
  }

  /** Destroys the sandbox now; a running exec ends with an executor error, queued ones get 404. */
  async delete(id: string): Promise<void> {
    const sandbox = this.get(id, true);
    this.sandboxes.delete(id);
    sandbox.queue.close(fail('sandboxDeleted', id));
    sandbox.brokenReason = 'the sandbox was deleted';
    await sandbox.vm.destroy('the sandbox was deleted');
    this.log.info({ sandbox: id }, 'deleted');
  }

  /** Destroys everything, pools included; new requests get 503. */
  async shutdown(): Promise<void> {
    this.shuttingDown = true;
    clearInterval(this.reaper);
    const all = [...this.sandboxes.values()];
    this.sandboxes.clear();
    for (const s of all) s.queue.close(fail('shuttingDown'));
    await Promise.all([
      ...all.map((s) => s.vm.destroy('hostd is shutting down')),
      ...[...this.pools.values()].map((p) => p.close()),
      this.host.spares?.close(),
    ]);
  }

  /** The VM's console and QEMU log tail, for error reports and failing tests. */
  async logTail(id: string): Promise<string> {
    return this.get(id, true).vm.logTail();
  }

  private get(id: string, allowBroken = false): Sandbox {
    const sandbox = isSandboxId(id) ? this.sandboxes.get(id) : undefined;
    if (!sandbox) throw fail('sandboxNotFound', id);
    if (!allowBroken) this.ensureUsable(sandbox);
    sandbox.touch();
    return sandbox;
  }

  private ensureUsable(sandbox: Sandbox): void {
    // The VM may be gone before its death was reported (the channel closes a moment before
    // QEMU's exit is seen): judge by its state, not only by events.
    if (!sandbox.brokenReason && !sandbox.vm.alive) {
      this.markBroken(sandbox, sandbox.vm, sandbox.vm.deathReason);
    }
    if (sandbox.brokenReason) {
      throw fail('sandboxBroken', sandbox.id, sandbox.brokenReason);
    }
  }

  /** Waits for the sandbox's turn and re-checks it still exists and works afterwards. */
  private async acquire(
    id: string,
    signal?: AbortSignal,
    allowBroken = false,
  ): Promise<{ sandbox: Sandbox; release: Release }> {
    this.ensureRunning();
    const sandbox = this.get(id, allowBroken);
    const release = await sandbox.queue.acquire(signal);
    if (this.sandboxes.get(id) !== sandbox) {
      release();
      throw fail('sandboxNotFound', id);
    }
    if (!allowBroken) {
      try {
        this.ensureUsable(sandbox);
      } catch (err) {
        release();
        throw err;
      }
    }
    return { sandbox, release };
  }

  private adopt(vm: Vm, template: string, parentId: string | null): Sandbox {
    const sandbox = new Sandbox(newSandboxId(), template, vm, parentId, this.config.maxQueuedExecs);
    this.sandboxes.set(sandbox.id, sandbox);
    this.watchVm(sandbox, vm);
    this.log.info({ sandbox: sandbox.id, vm: vm.id, template, parent: parentId }, 'sandbox ready');
    return sandbox;
  }

  /** A VM that dies makes its sandbox report executor errors until it is deleted. */
  private watchVm(sandbox: Sandbox, vm: Vm): void {
    vm.removeAllListeners('died');
    vm.once('died', (why: string) => {
      if (sandbox.vm !== vm) return;
      this.markBroken(sandbox, vm, why);
    });
    // It may have died before anyone listened (a fork child waiting for its siblings).
    if (!vm.alive) this.markBroken(sandbox, vm, vm.deathReason);
  }

  private markBroken(sandbox: Sandbox, vm: Vm, why: string): void {
    if (sandbox.vm !== vm || sandbox.brokenReason) return;
    sandbox.brokenReason = why;
    this.log.warn({ sandbox: sandbox.id, vm: vm.id, why }, 'sandbox VM failed');
    void vm.logTail().then((tail) => this.log.warn({ sandbox: sandbox.id, tail }, 'VM log tail'));
    void vm.destroy();
  }

  private async reapIdle(): Promise<void> {
    const cutoff = Date.now() - this.config.idleTimeoutS * 1000;
    for (const s of [...this.sandboxes.values()]) {
      if (s.lastUsedAt < cutoff && !s.queue.running) {
        this.log.info({ sandbox: s.id, idleS: this.config.idleTimeoutS }, 'deleting idle sandbox');
        await this.delete(s.id).catch(() => undefined);
      }
    }
  }

  private ensureRunning(): void {
    if (this.shuttingDown) throw fail('shuttingDown');
  }

  /** 503 when the host could not afford `vms` more VMs (and an image of `imageMib`). */
  private ensureResources(vms: number, imageMib: number): void {
    const why = this.resourceShortage(vms, imageMib);
    if (why) throw fail('insufficientResources', why);
  }

  private resourceShortage(vms: number, imageMib: number): string | null {
    return shortage(hostFree(this.config.stateDir), {
      vms,
      perVmMib: this.config.tcgTbMib + 48,
      imageMib,
      reserveMib: this.config.minFreeMib,
    });
  }

  private ensureCapacity(n: number): void {
    const alive = this.sandboxes.size + this.reserved;
    if (alive + n > this.config.maxSandboxes) {
      throw fail('sandboxLimit', alive, n, this.config.maxSandboxes);
    }
  }

  /**
   * A VM-layer failure as the registry entry `name`, whose last argument is the VM's reason.
   * HostdErrors pass through unchanged.
   */
  private vmError<K extends 'vmStartFailed' | 'vmOperationFailed' | 'forkChildrenFailed'>(
    err: unknown,
    name: K,
    ...context: DropLast<Parameters<(typeof Errors)[K]['message']>>
  ): HostdError {
    if (err instanceof HostdError) return err;
    const message = err instanceof Error ? err.message : String(err);
    if (err instanceof VmError && err.consoleTail) {
      this.log.error({ tail: err.consoleTail }, 'VM failure log tail');
    }
    const args = [...context, message] as unknown as Parameters<(typeof Errors)[K]['message']>;
    return failWith(err, name, ...args);
  }
}
