/**
 * Owns every sandbox: create from a pool, exec through a per-sandbox FIFO, fork and merge
 * (core/lineage.ts), delete, reap idle ones, shut down. It speaks in typed errors and async
 * iterables; it knows nothing of HTTP, and of machines only the vm/machine.ts interfaces.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import type { Hypervisor, Language } from '../vm/machine.js';
import { Admission } from './admission.js';
import { ExecRun } from './exec-run.js';
import { ForkStandby } from './fork-standby.js';
import type { HostFree } from './host-resources.js';
import { IdleReaper } from './idle-reaper.js';
import type { SandboxJournal } from './journal.js';
import { asMachineError, Lineage } from './lineage.js';
import { TemplatePool, type PoolConfig, type PoolStats, type RefillPauses } from './pool.js';
import { SandboxRegistry } from './registry.js';
import type { Sandbox, SandboxInfo } from './sandbox.js';

export { MAX_FORK } from './lineage.js';
export type { Language } from '../vm/machine.js';

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

export interface ManagerOptions {
  /** In order; the first is the default. */
  readonly templates: readonly PoolConfig[];
  readonly maxSandboxes: number;
  readonly maxQueuedExecs: number;
  /** Seconds without any request after which a sandbox is deleted; 0: never. */
  readonly idleTimeoutS: number;
  /** Memory and state-dir space (MiB) that must stay free after starting a VM. */
  readonly minFreeMib: number;
  /** Output (bytes of event data) one exec may produce before it is interrupted. */
  readonly maxExecOutputBytes: number;
  /** Most machines kept started ahead per template for forks (core/fork-standby.ts). */
  readonly forkStandbyMax: number;
  /** The host's free memory and state-dir space now. */
  readonly hostFree: () => HostFree;
  readonly refillPauses?: RefillPauses;
  /** Where each sandbox's record goes (core/journal.ts); none by default. */
  readonly journal?: SandboxJournal;
}

const secondsSince = (start: bigint): number => Number(process.hrtime.bigint() - start) / 1e9;

export class SandboxManager {
  private readonly registry: SandboxRegistry;
  private readonly pools = new Map<string, TemplatePool>();
  private readonly admission: Admission;
  private readonly standby: ForkStandby;
  private readonly lineage: Lineage;
  private readonly reaper: IdleReaper;
  private stopping = false;

  constructor(
    private readonly options: ManagerOptions,
    private readonly hypervisor: Hypervisor,
    private readonly log: Logger,
    private readonly observer: ManagerObserver = {},
  ) {
    this.registry = new SandboxRegistry(log, options.maxQueuedExecs, options.journal);
    this.admission = new Admission(
      {
        maxSandboxes: options.maxSandboxes,
        reserveMib: options.minFreeMib,
        perVmMib: hypervisor.machineOverheadMib,
      },
      options.hostFree,
      () => this.registry.size,
    );
    this.standby = new ForkStandby(hypervisor, options.forkStandbyMax, (vms, mib) =>
      this.admission.shortage(vms, mib),
    );
    this.lineage = new Lineage({
      registry: this.registry,
      hypervisor,
      admission: this.admission,
      standby: this.standby,
      log,
      stopping: () => this.stopping,
      onForked: (n, s) => observer.forked?.(n, s),
    });
    this.reaper = new IdleReaper(
      options.idleTimeoutS,
      () => this.registry.all(),
      async (s) => {
        log.info({ sandbox: s.id, idleS: options.idleTimeoutS }, 'deleting idle sandbox');
        await this.delete(s.id);
      },
    );
  }

  /** Boots every template (in turn: they compete for the same CPUs) and starts the reaper. */
  async start(): Promise<void> {
    for (const t of this.options.templates) {
      const pool = new TemplatePool(
        t,
        this.hypervisor,
        this.log,
        () => this.admission.shortage(1),
        () => this.observer.vmStartFailed?.(),
        this.options.refillPauses,
      );
      this.pools.set(t.name, pool);
      this.standby.register(await pool.init());
    }
    this.reaper.start();
  }

  templateBootMs(template = this.defaultTemplate): number {
    return this.pools.get(template)?.bootMs ?? 0;
  }

  poolStats(): PoolStats[] {
    return [...this.pools.values()].map((p) => p.stats());
  }

  /** Machines started ahead for forks, and whether more are being started. */
  forkStandby(): { vms: number; filling: boolean } {
    return { vms: this.standby.standby, filling: this.standby.filling };
  }

  get count(): number {
    return this.registry.size;
  }

  list(): SandboxInfo[] {
    return this.registry.all().map((s) => s.info());
  }

  describe(id: string): SandboxInfo {
    return this.registry.get(id, false).info();
  }

  async create(template: string | undefined): Promise<Sandbox> {
    this.ensureRunning();
    const name = template ?? this.defaultTemplate;
    const pool = this.pools.get(name);
    if (!pool) throw fail('templateNotFound', name, [...this.pools.keys()]);
    const started = process.hrtime.bigint();
    const admitted = this.admission.admit(1);
    let taken;
    try {
      taken = await pool.take();
    } catch (err) {
      throw asMachineError(err, this.log, 'vmStartFailed');
    } finally {
      admitted();
    }
    if (this.stopping) {
      await taken.machine.destroy();
      throw fail('shuttingDown');
    }
    const sandbox = this.registry.adopt(taken.machine, name, null);
    this.observer.created?.(taken.hit, secondsSince(started));
    return sandbox;
  }

  /**
   * Waits for the sandbox's turn, then starts the exec and returns its event stream. The turn
   * is held until the exec has finished on the machine, whatever the consumer does.
   */
  async exec(id: string, req: ExecRequest): Promise<ExecRun> {
    this.ensureRunning();
    const { sandbox, release } = await this.registry.acquire(id, req.signal);
    const started = process.hrtime.bigint();
    const { machine } = sandbox;
    let run: ExecRun;
    try {
      run = new ExecRun(
        machine,
        { ...req, maxOutputBytes: this.options.maxExecOutputBytes },
        (why) => this.registry.markBroken(sandbox, machine, why),
      );
    } catch (err) {
      release();
      throw asMachineError(err, this.log, 'vmOperationFailed', 'start the exec');
    }
    this.observer.execStarted?.();
    void run.done.then(() => {
      sandbox.touch();
      release();
      this.observer.execFinished?.(secondsSince(started));
    });
    return run;
  }

  /** Forks `id` into n copy-on-write children, all or nothing (core/lineage.ts). */
  fork(id: string, n: number): Promise<Sandbox[]> {
    this.ensureRunning();
    return this.lineage.fork(id, n);
  }

  /** The parent id adopts the winner's machine (core/lineage.ts). */
  merge(parentId: string, winnerId: string): Promise<SandboxInfo> {
    if (parentId !== winnerId) this.ensureRunning();
    return this.lineage.merge(parentId, winnerId);
  }

  /** Destroys the sandbox now; a running exec ends with an executor error, queued ones get 404. */
  async delete(id: string): Promise<void> {
    const sandbox = this.registry.get(id, false);
    this.registry.remove(sandbox, fail('sandboxDeleted', id));
    sandbox.brokenReason = 'the sandbox was deleted';
    await sandbox.machine.destroy('the sandbox was deleted');
    this.log.info({ sandbox: id }, 'deleted');
  }

  /** Destroys everything, pools included; new requests get 503. */
  async shutdown(): Promise<void> {
    this.stopping = true;
    this.reaper.stop();
    const all = this.registry.all();
    for (const s of all) this.registry.remove(s, fail('shuttingDown'));
    await Promise.all([
      ...all.map((s) => s.machine.destroy('hostd is shutting down')),
      ...[...this.pools.values()].map((p) => p.close()),
      this.standby.close(),
    ]);
  }

  /** The machine's console and log tail, for error reports and failing tests. */
  async logTail(id: string): Promise<string> {
    return this.registry.get(id, false).machine.logTail();
  }

  private get defaultTemplate(): string {
    return this.options.templates[0]!.name;
  }

  private ensureRunning(): void {
    if (this.stopping) throw fail('shuttingDown');
  }
}
