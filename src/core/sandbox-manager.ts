/**
 * Owns every sandbox: create from a pool or a snapshot, exec through a per-sandbox FIFO, fork
 * and merge (core/lineage.ts), snapshot, pause and resume, delete, reap idle ones, and on
 * shutdown write every sandbox to disk so that the next start has them all. It speaks in typed
 * errors and async iterables; it knows nothing of HTTP, and of machines only the
 * vm/machine.ts interfaces.
 */
import { availableParallelism } from 'node:os';
import type { Logger } from 'pino';
import { fail, HostdError } from '../errors.js';
import type {
  ExecSpec,
  ExportedRead,
  FileFetcher,
  FrozenState,
  Hypervisor,
  Machine,
  PausedManifest,
  StateManifest,
  TemplateImages,
} from '../vm/machine.js';
import { VmError } from '../vm/machine.js';
import { Admission } from './admission.js';
import { CopyRoom, storageCapRefusal } from './copy-room.js';
import { eachAtOnce } from './each-at-once.js';
import { ExecRun } from './exec-run.js';
import { ForkStandby } from './fork-standby.js';
import type { HostFree } from './host-resources.js';
import { IdleReaper } from './idle-reaper.js';
import { LifetimeKeeper } from './lifetimes.js';
import { MetricsSampler, type SandboxMetric } from './sandbox-metrics.js';
import type { RecordStore, SandboxRecord, SnapshotRecord } from './journal.js';
import { Lineage } from './lineage.js';
import { asMachineError, clientReason } from './machine-error.js';
import { isSnapshotId } from './ids.js';
import { TemplatePool, type PoolStats, type RefillPauses } from './pool.js';
import { SandboxRegistry, type StopListener } from './registry.js';
import type { Lifetime, PauseReason, Sandbox, SandboxInfo, SandboxState } from './sandbox.js';
import { Snapshots, type SnapshotInfo } from './snapshots.js';
import { SandboxFiles } from './sandbox-files.js';
import { SandboxProcesses } from './sandbox-processes.js';
import { SandboxContexts } from './sandbox-contexts.js';
import { SandboxNetwork, type EgressEnvironment } from './network.js';
import { TemplateCatalog, type TemplateInfo } from './template-catalog.js';
import type { TemplatePlan } from './template-plan.js';

export { MAX_FORK } from './lineage.js';
export type { StopListener, StopReason } from './registry.js';
export { validateAllowOut } from './network.js';
export type {
  DetailedEntry,
  FileDownload,
  FileEntry,
  ExtractResult,
  MkdirResult,
  MoveResult,
  UserWriteResult,
  WriteResult,
} from './sandbox-files.js';
export type {
  ProcessEnd,
  ProcessEvent,
  ProcessInfo,
  ProcessRun,
  ProcessSelector,
  ProcessSpec,
  WatchEvent,
  WatchRun,
  WatchSpec,
} from './sandbox-processes.js';
export type { Language } from '../vm/machine.js';
export type { SnapshotInfo } from './snapshots.js';
export type { Lifetime, PauseReason, SandboxInfo } from './sandbox.js';
export type { SandboxMetric } from './sandbox-metrics.js';
export type { TemplateInfo } from './template-catalog.js';

/** Hooks for metrics; the api layer wires them to prom-client. */
export interface ManagerObserver {
  execStarted?(): void;
  execFinished?(seconds: number): void;
  forked?(n: number, seconds: number): void;
  created?(hit: boolean, seconds: number): void;
  vmStartFailed?(): void;
}

export interface ExecRequest extends ExecSpec {
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface CreateRequest {
  template?: string;
  snapshot?: string;
  /** The sandbox's default environment (forks inherit it with the VM). */
  env?: Readonly<Record<string, string>>;
  /** Validated `network.allow_out` (validateAllowOut); from a snapshot, default its rules. */
  allowOut?: readonly string[];
  /** Labels shown in its info and kept with it (docs/api.md, Metadata and lifetime). */
  metadata?: Readonly<Record<string, string>>;
  /** A running-time limit; none by default. */
  lifetime?: Lifetime;
}

/** Longest lifetime a sandbox may be given, in seconds: 30 days. */
export const MAX_LIFETIME_S = 30 * 24 * 3600;
/** How long an expiry that could not pause the sandbox waits before it tries again. */
const EXPIRY_RETRY_MS = 60_000;

/**
 * What the manager asks of cluster mode (core/cluster/cluster-node.ts); absent for a single
 * hostd. New sandboxes and snapshots are answered only once their catalog entries exist, so that
 * every node can route to them.
 */
export interface ClusterHooks {
  /** This node's id: sandbox info says it (`node`). */
  readonly nodeId: string;
  /** 503 cluster_unavailable when the catalog cannot be written now (refuse before any work). */
  ensureConnected(): void;
  confirmSandboxes(ids: readonly string[]): Promise<void>;
  confirmSnapshot(id: string): Promise<void>;
  /**
   * Makes snapshot `id`, held by another node, held here (its files fetched from there): a
   * create from it was placed on this node.
   */
  fetchSnapshot?(id: string): Promise<void>;
}

export interface ManagerOptions {
  /** The templates to serve, in order (core/template-plan.ts); the first is the default. */
  readonly templates: readonly TemplatePlan[];
  /** Where templates' images are found, and built when missing. */
  readonly images: TemplateImages;
  readonly maxSandboxes: number;
  readonly maxQueuedExecs: number;
  /** Seconds without any request after which a sandbox is paused or deleted; 0: never. */
  readonly idleTimeoutS: number;
  /** What happens to an idle sandbox. */
  readonly idleAction?: 'pause' | 'delete';
  /** Seconds a paused sandbox is kept before it is deleted; 0: until deleted. */
  readonly pausedTtlS?: number;
  /** MiB snapshots and paused sandboxes may take on disk; past it they get 507. 0: no cap. */
  readonly maxStorageMib?: number;
  /** Memory and data-dir space (MiB) that must stay free after starting a VM. */
  readonly minFreeMib: number;
  /** Output (bytes of event data) one exec may produce before it is interrupted. */
  readonly maxExecOutputBytes: number;
  /** Most machines kept started ahead per template for forks (core/fork-standby.ts). */
  readonly forkStandbyMax: number;
  /**
   * How many of a fork's children run their guest at once (core/lineage.ts); by default twice
   * the host's cores, which measured best under TCG (docs/architecture.md, "A fork's guests a
   * few at a time"; main.ts passes 0 under KVM). 0 or Infinity: all of them.
   */
  readonly forkRunAtOnce?: number;
  /** The host's free memory and data-dir space now. */
  readonly hostFree: () => HostFree;
  readonly refillPauses?: RefillPauses;
  /**
   * Warm each pool machine's files path too (SERVICE_POOL_WARM_FILES=1): a new sandbox's first
   * small file operations then cost what later ones do, and every idle pool machine holds what
   * translating that path takes (~8 MiB under TCG), so it is the operator's choice.
   */
  readonly poolWarmFiles?: boolean;
  /** Where sandbox and snapshot records go (core/journal.ts); in memory by default. */
  readonly records?: {
    sandboxes: RecordStore<SandboxRecord>;
    snapshots: RecordStore<SnapshotRecord>;
  };
  /** Pause every sandbox on shutdown (and destroy otherwise). Default true. */
  readonly pauseOnShutdown?: boolean;
  /** Where hostd's API listens: never reachable from a sandbox. */
  readonly egress: EgressEnvironment;
  /** SERVICE_MAX_FILE_BYTES. */
  readonly maxFileBytes: number;
  /** Cluster mode; absent for a single hostd. */
  readonly cluster?: ClusterHooks;
}

/**
 * A sandbox on its way to another node (core/cluster/hand-over.ts): paused, its files exported,
 * its turn held so that nothing runs it meanwhile; what arrives for it waits.
 */
export interface OutgoingMove {
  /** Its record, as the target registers it (same id, same labels, paused). */
  readonly record: SandboxRecord;
  readonly manifest: PausedManifest;
  /** The target has it: the local copy goes, and what waited for it gets 503 sandbox_moving. */
  finish(): Promise<void>;
  /** The hand-over did not happen: it stays here, paused, and resumes on its next use. */
  abort(): void;
}

/**
 * A snapshot on its way to another node (core/cluster/hand-over.ts): it keeps serving here
 * meanwhile (it never changes); a delete of it answers 503 sandbox_moving until the move ends.
 */
export interface OutgoingSnapshot {
  /** Its record, as the target registers it (same id, name and dates). */
  readonly record: SnapshotRecord;
  readonly manifest: StateManifest;
  /** The target has it: the local copy goes (its files once no local sandbox uses them). */
  finish(): void;
  /** The hand-over did not happen: it stays here. */
  abort(): void;
}

/** What a new sandbox is told besides its template: its labels and lifetime. */
type Labels = { metadata: Readonly<Record<string, string>>; lifetime: Lifetime | null };

const secondsSince = (start: bigint): number => Number(process.hrtime.bigint() - start) / 1e9;
/** Sandboxes paused at once on shutdown: each is a burst of disk writes. */
const SHUTDOWN_PAUSES_AT_ONCE = 4;

export class SandboxManager {
  private readonly registry: SandboxRegistry;
  private readonly catalog: TemplateCatalog;
  private readonly admission: Admission;
  /** Cluster mode: room for copies from other nodes, asked before any file is fetched. */
  private readonly copyRoom: CopyRoom;
  private readonly standby: ForkStandby;
  private readonly lineage: Lineage;
  private readonly reaper: IdleReaper;
  private readonly lifetimes: LifetimeKeeper;
  private readonly sampler: MetricsSampler;
  private readonly snapshots: Snapshots;
  private readonly network: SandboxNetwork;
  /** Reading and writing sandboxes' files (docs/api.md, Files). */
  readonly files: SandboxFiles;
  /** Processes beside the exec queue, and directory watches (core/sandbox-processes.ts). */
  readonly processes: SandboxProcesses;
  /** Sandboxes' REPL contexts (docs/api.md, Contexts). */
  readonly contexts: SandboxContexts;
  private stopping = false;
  /** Sandboxes being taken over from another node (`moveIn`), until registered. */
  private readonly incoming = new Set<string>();
  /** Snapshots being handed to another node (`moveSnapshotOut`): id -> that node. */
  private readonly snapshotsMoving = new Map<string, string>();
  /**
   * Bytes of snapshots captured but not kept yet (their files syncing, with the sandbox's turn
   * released: `takeSnapshot`): counted against the storage cap as if they were kept.
   */
  private syncingSnapshotBytes = 0;
  /** Snapshots captured whose files sync, before they are kept (`snapshotsSettled`). */
  private readonly snapshotsSyncing = new Set<Promise<unknown>>();
  /** Creates in flight: shutdown waits for them, so that no VM they start outlives hostd. */
  private readonly creating = new Set<Promise<unknown>>();

  constructor(
    private readonly options: ManagerOptions,
    private readonly hypervisor: Hypervisor,
    private readonly log: Logger,
    private readonly observer: ManagerObserver = {},
  ) {
    this.network = new SandboxNetwork(options.egress, log);
    this.registry = new SandboxRegistry(
      log,
      options.maxQueuedExecs,
      hypervisor,
      (machine, allowOut) => this.network.bind(machine, allowOut),
      options.records?.sandboxes,
    );
    this.files = new SandboxFiles(this.registry, log, options.maxFileBytes);
    this.processes = new SandboxProcesses(this.registry, log);
    this.contexts = new SandboxContexts(this.registry, log);
    this.snapshots = new Snapshots(
      hypervisor,
      options.records?.snapshots,
      (id) => this.registry.all().filter((s) => s.snapshotId === id).length,
    );
    this.admission = new Admission(
      {
        maxSandboxes: options.maxSandboxes,
        reserveMib: options.minFreeMib,
        perVmMib: hypervisor.machineOverheadMib,
      },
      options.hostFree,
      () => this.registry.running,
    );
    this.copyRoom = new CopyRoom({
      maxStorageMib: options.maxStorageMib ?? 0,
      usedBytes: () => this.storageBytes(),
      diskShortage: (mib) => this.admission.diskShortage(mib),
    });
    this.standby = new ForkStandby(
      hypervisor,
      options.forkStandbyMax,
      (vms, mib) => this.admission.shortage(vms, mib),
      (err) => log.warn({ err }, 'could not prepare a fork ahead; the next fork copies its image'),
    );
    this.lineage = new Lineage({
      registry: this.registry,
      hypervisor,
      admission: this.admission,
      standby: this.standby,
      log,
      stopping: () => this.stopping,
      network: this.network,
      onForked: (n, s) => observer.forked?.(n, s),
      runAtOnce: options.forkRunAtOnce ?? 2 * availableParallelism(),
    });
    this.catalog = new TemplateCatalog(
      options.templates,
      options.images,
      (plan, image) =>
        new TemplatePool(
          plan,
          image,
          hypervisor,
          log,
          () => this.admission.shortage(1),
          () => observer.vmStartFailed?.(),
          options.refillPauses,
          options.poolWarmFiles ?? false,
        ),
      (_name, state) => this.standby.register(state),
      log,
    );
    this.reaper = new IdleReaper(
      options.idleTimeoutS,
      options.pausedTtlS ?? 0,
      () => this.registry.all(),
      {
        idle: async (s) => {
          const pause = (options.idleAction ?? 'pause') === 'pause';
          log.info({ sandbox: s.id, idleS: options.idleTimeoutS, pause }, 'idle sandbox');
          await (pause ? this.pause(s.id, 'idle') : this.delete(s.id));
        },
        expired: async (s) => {
          log.info({ sandbox: s.id }, 'deleting a sandbox paused for too long');
          await this.delete(s.id);
        },
        // A sandbox deleted meanwhile, hostd stopping, or a VM failure (logged and, when the
        // machine is lost, the sandbox failed): the next sweep tries again if it still applies.
        failed: (s, err) => log.warn({ sandbox: s.id, err }, 'idle sandbox could not be reaped'),
      },
    );
    this.lifetimes = new LifetimeKeeper(
      () => this.registry.all(),
      (s) => this.expire(s),
    );
    this.registry.onExpiryChange = () => this.lifetimes.reschedule();
    this.sampler = new MetricsSampler(
      () => this.registry.all(),
      (s) => {
        try {
          const t = this.catalog.describe(s.template);
          return { vcpus: t.vcpus, memoryMib: t.memory_mib, diskMib: t.disk_mib };
        } catch {
          return { vcpus: 1, memoryMib: 0, diskMib: 0 }; // a template no longer served
        }
      },
    );
    this.registry.onStopped((id, why) => {
      if (why === 'deleted') this.sampler.forget(id);
    });
  }

  /**
   * At the end of its lifetime a sandbox is deleted, or paused (an exec running then is
   * interrupted: the lifetime is a limit). A pause that fails leaves it running and is tried
   * again a minute later.
   */
  private async expire(s: Sandbox): Promise<void> {
    const pause = s.lifetime?.onTimeout === 'pause';
    this.log.info({ sandbox: s.id, pause }, 'sandbox lifetime is up');
    try {
      if (!pause) return await this.delete(s.id);
      s.currentRun?.interrupt('the sandbox reached the end of its lifetime');
      await this.pause(s.id, 'lifetime');
    } catch (err) {
      if (!this.registry.holds(s) || s.paused) return;
      this.log.error({ err, sandbox: s.id }, 'could not end a sandbox whose lifetime is up');
      if (s.expiresAt) s.setLifetime(s.lifetime, new Date(Date.now() + EXPIRY_RETRY_MS));
    }
  }

  /**
   * Reads back what earlier runs left (snapshots, paused sandboxes), boots every template already
   * built (in turn: they compete for the same CPUs), removes what no record uses, starts
   * building the other templates in the background, starts the reaper. Sandboxes are resumed
   * on first use, so start-up time does not grow with their number.
   */
  async start(): Promise<void> {
    for (const { id, why } of await this.snapshots.load()) {
      this.log.error({ snapshot: id, why }, 'a snapshot could not be reopened; it is dropped');
    }
    await this.readmitSandboxes();
    // Forks' spare copies start once the collection below is over: it would delete them.
    this.standby.hold();
    await this.catalog.start();
    // Every state this run needs is open: what earlier runs left and nothing uses goes. Before
    // any build starts: a template booting meanwhile would have its fresh state collected.
    const removed = await this.hypervisor.collectGarbage();
    if (removed) this.log.info({ removed }, 'removed frozen states no record uses');
    this.standby.resume();
    this.catalog.buildMissing();
    this.reaper.start();
    this.sampler.start();
    // Lifetimes that ended while hostd was down end now.
    this.lifetimes.sweep();
  }

  templateBootMs(template = this.defaultTemplate): number {
    return this.catalog.pools().find((p) => p.config.name === template)?.bootMs ?? 0;
  }

  poolStats(): PoolStats[] {
    return this.catalog.pools().map((p) => p.stats());
  }

  /** Every template, in configuration order (the first is the default), with its state. */
  listTemplates(): TemplateInfo[] {
    return this.catalog.list();
  }

  describeTemplate(name: string): TemplateInfo {
    return this.catalog.describe(name);
  }

  /** The end of template `name`'s last build log, for a build that failed or runs. */
  templateBuildLog(name: string): Promise<string> {
    return this.catalog.buildLog(name);
  }

  /** Machines started ahead for forks, and whether more are being started. */
  forkStandby(): { vms: number; filling: boolean } {
    return { vms: this.standby.vms, filling: this.standby.filling };
  }

  /**
   * Calls `listener` whenever a sandbox stops running (deleted, expired, merged away, paused,
   * failed). Returns the unsubscribe function.
   */
  onSandboxStopped(listener: StopListener): () => void {
    return this.registry.onStopped(listener);
  }

  get count(): number {
    return this.registry.size;
  }

  list(): SandboxInfo[] {
    return this.registry.all().map((s) => this.withNode(s.info()));
  }

  describe(id: string): SandboxInfo {
    return this.withNode(this.registry.get(id, false).info());
  }

  /** This node's id in cluster mode (sandbox info's `node`), else null. */
  get nodeId(): string | null {
    return this.options.cluster?.nodeId ?? null;
  }

  /** True when this hostd holds sandbox `id` (running, paused, or lost while it was down). */
  holds(id: string): boolean {
    return this.registry.has(id);
  }

  holdsSnapshot(id: string): boolean {
    return this.snapshots.has(id);
  }

  /**
   * Cluster mode: the template of sandbox `id` when it is paused here and this node has no room
   * to resume it now (its cap reached, or short of memory), else null. Its next use is better
   * served on another node (core/cluster/hand-over.ts `moveToRoom`) than over this one's cap.
   */
  pausedWithoutRoom(id: string): string | null {
    if (!this.registry.has(id)) return null;
    let sandbox;
    try {
      sandbox = this.registry.get(id, false);
    } catch {
      return null; // lost: answered where it is
    }
    if (!sandbox.paused || !this.admission.wouldRefuse(1)) return null;
    return sandbox.template;
  }

  /** The ids of the snapshots this hostd holds. */
  snapshotIds(): string[] {
    return this.snapshots.list().map((s) => s.snapshot_id);
  }

  /**
   * Cluster mode: snapshot `id`'s record and the manifest of its files, for a node that copies
   * it (a create from it placed there). It stays here, unchanged.
   */
  async exportSnapshot(id: string): Promise<{ record: SnapshotRecord; manifest: StateManifest }> {
    this.ensureRunning();
    const { record, state } = this.snapshots.entry(id);
    return { record, manifest: await this.exportSnapshotState(id, state) };
  }

  /** The manifest of snapshot `id`'s files, for a copy or a hand-over; VM failures typed. */
  private exportSnapshotState(id: string, state: FrozenState): Promise<StateManifest> {
    return this.hypervisor.exportState(state).catch((err: unknown) => {
      throw asMachineError(
        err,
        this.log,
        { snapshot: id },
        'vmOperationFailed',
        'export the snapshot',
      );
    });
  }

  async create(req: CreateRequest): Promise<Sandbox> {
    this.ensureRunning();
    this.options.cluster?.ensureConnected();
    const labels = { metadata: req.metadata ?? {}, lifetime: req.lifetime ?? null };
    const p =
      req.snapshot !== undefined
        ? this.createFromSnapshot(req.snapshot, req.env, req.allowOut, labels)
        : this.createFromPool(req.template, req.env, req.allowOut ?? [], labels);
    this.creating.add(p);
    let sandbox: Sandbox;
    try {
      sandbox = await p;
    } finally {
      this.creating.delete(p);
    }
    await this.placed([sandbox.id]);
    return sandbox;
  }

  /**
   * Cluster mode: waits until new sandboxes are in the catalog, or destroys them and throws (503
   * cluster_unavailable): a sandbox other nodes cannot find must not be handed to a client.
   */
  private async placed(ids: readonly string[]): Promise<void> {
    const cluster = this.options.cluster;
    if (!cluster) return;
    try {
      await cluster.confirmSandboxes(ids);
    } catch (err) {
      await Promise.all(ids.map((id) => this.delete(id).catch(() => undefined)));
      throw err;
    }
  }

  /**
   * Cluster mode: destroys the local copy of sandbox `id`, which the catalog says was deleted
   * through another node or belongs to another node now (fencing). Nothing is written back.
   */
  async fence(id: string, why: string): Promise<void> {
    if (this.registry.forgetLost(id)) return;
    if (!this.registry.has(id)) return;
    const sandbox = this.registry.get(id, false);
    await this.destroyState(sandbox.delete(why, fail('sandboxNotFound', id)), why);
    this.log.warn({ sandbox: id, why }, 'local copy destroyed (fenced)');
  }

  /** The same for a snapshot (its files go once no local sandbox uses them). */
  fenceSnapshot(id: string, why: string): void {
    if (!this.snapshots.has(id)) return;
    this.snapshots.delete(id);
    this.log.warn({ snapshot: id, why }, 'local snapshot dropped (fenced)');
  }

  /**
   * Cluster mode, the source side of a hand-over: takes the sandbox's turn (both lanes), pauses
   * it if it runs, and exports its files. The turn is held until `finish` or `abort`.
   */
  async moveOut(id: string, to: string): Promise<OutgoingMove> {
    this.ensureRunning();
    const sandbox = this.registry.get(id, true);
    const release = await sandbox.acquireAll();
    try {
      if (!this.registry.holds(sandbox)) throw fail('sandboxNotFound', id);
      if (!sandbox.paused) await this.pauseHeld(sandbox, 'shutdown');
      const paused = sandbox.paused!;
      const manifest = await this.hypervisor.exportPaused(paused).catch((err: unknown) => {
        throw asMachineError(
          err,
          this.log,
          { sandbox: id },
          'vmOperationFailed',
          'export the sandbox',
        );
      });
      let done = false;
      return {
        record: sandbox.record(),
        manifest,
        finish: async () => {
          if (done) return;
          done = true;
          const why = `the sandbox moved to node ${to}`;
          try {
            await this.destroyState(
              sandbox.delete(why, fail('sandboxMoving', `sandbox ${id}`, to)),
              why,
            );
          } finally {
            release();
          }
          this.log.info({ sandbox: id, to }, 'sandbox handed over');
        },
        abort: () => {
          if (done) return;
          done = true;
          release();
        },
      };
    } catch (err) {
      release();
      throw err;
    }
  }

  /**
   * Cluster mode, the target side of a hand-over: fetches the files of the paused sandbox
   * `record` names that this node lacks (through `fetch`) and registers it under its id, paused:
   * its next use resumes it here.
   */
  async moveIn(
    record: SandboxRecord,
    manifest: PausedManifest,
    fetch: FileFetcher,
  ): Promise<SandboxInfo> {
    this.ensureRunning();
    const id = record.id;
    if (this.registry.has(id) || this.incoming.has(id)) throw fail('clusterConflict', id);
    if (record.state !== 'paused' || record.paused?.id !== manifest.paused.id) {
      throw fail('invalidField', 'record', 'a paused sandbox matching the manifest', record.state);
    }
    // Refused before anything is fetched when it would not fit: the source asks the next node.
    const admitted = this.copyRoom.admit(manifest);
    this.incoming.add(id);
    try {
      const paused = await this.hypervisor.importPaused(manifest, fetch).catch((err: unknown) => {
        if (err instanceof HostdError) throw err;
        throw asMachineError(
          err,
          this.log,
          { sandbox: id },
          'vmOperationFailed',
          'take over the sandbox',
        );
      });
      const sandbox = this.registry.readmit(record, originOf(record), {
        kind: 'paused',
        paused,
        at: new Date(record.paused_at ?? Date.now()),
        by: record.paused_by ?? null,
      });
      await this.registry.flushRecords();
      this.log.info(
        { sandbox: id, bytes: paused.sizeBytes },
        'sandbox taken over from another node',
      );
      return this.withNode(sandbox.info());
    } finally {
      this.incoming.delete(id);
      admitted();
    }
  }

  /**
   * Cluster mode, the source side of a snapshot's hand-over: its record and the manifest of its
   * files (its frozen state and disk layers), which the target fetches from this node.
   */
  async moveSnapshotOut(id: string, to: string): Promise<OutgoingSnapshot> {
    this.ensureRunning();
    const { record, state } = this.snapshots.entry(id);
    if (this.snapshotsMoving.has(id)) throw fail('sandboxMoving', `snapshot ${id}`, to);
    this.snapshotsMoving.set(id, to);
    let done = false;
    const end = (): boolean => {
      if (done) return false;
      done = true;
      this.snapshotsMoving.delete(id);
      return true;
    };
    try {
      const manifest = await this.exportSnapshotState(id, state);
      return {
        record,
        manifest,
        finish: () => {
          if (!end()) return;
          if (this.snapshots.has(id)) this.snapshots.delete(id);
          this.log.info({ snapshot: id, to }, 'snapshot handed over');
        },
        abort: () => void end(),
      };
    } catch (err) {
      end();
      throw err;
    }
  }

  /**
   * Cluster mode, the target side of a snapshot's hand-over: fetches the files of the snapshot
   * `record` names that this node lacks (a fork point a sandbox moved here already brought is
   * not fetched again) and registers it under its id.
   */
  async moveSnapshotIn(
    record: SnapshotRecord,
    manifest: StateManifest,
    fetch: FileFetcher,
  ): Promise<SnapshotInfo> {
    this.ensureRunning();
    const id = record.id;
    if (this.snapshots.has(id) || this.incoming.has(id)) throw fail('clusterConflict', id);
    // Refused before anything is fetched when it would not fit: the next node is asked.
    const admitted = this.copyRoom.admit(manifest);
    this.incoming.add(id);
    try {
      const state = await this.hypervisor.importState(manifest, fetch).catch((err: unknown) => {
        if (err instanceof HostdError) throw err;
        throw asMachineError(
          err,
          this.log,
          { snapshot: id },
          'vmOperationFailed',
          'take over the snapshot',
        );
      });
      const info = await this.snapshots.adopt(record, state.retain());
      this.log.info({ snapshot: id }, 'snapshot taken over from another node');
      return info;
    } finally {
      this.incoming.delete(id);
      admitted();
    }
  }

  /** A file an export of this node listed, for the peer that imports it. */
  async readExported(path: string, offset: number): Promise<ExportedRead> {
    try {
      return await this.hypervisor.readExported(path, offset);
    } catch (err) {
      if (err instanceof VmError) throw fail('peerFileNotFound');
      throw err;
    }
  }

  private async createFromPool(
    template: string | undefined,
    env: CreateRequest['env'],
    allowOut: readonly string[],
    labels: Labels,
  ): Promise<Sandbox> {
    const name = template ?? this.defaultTemplate;
    const pool = this.catalog.pool(name);
    const started = process.hrtime.bigint();
    const admitted = this.admission.admit(1);
    let taken;
    try {
      taken = await pool.take();
    } catch (err) {
      throw asMachineError(err, this.log, { template: name }, 'vmStartFailed');
    } finally {
      admitted();
    }
    await this.prepare(taken.machine, env, allowOut);
    const sandbox = this.registry.adopt(taken.machine, {
      template: name,
      parentId: null,
      snapshotId: null,
      allowOut,
      ...labels,
    });
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
    if (this.stopping) {
      // Its turn came after shutdown began interrupting what ran: it never starts.
      release();
      throw fail('shuttingDown');
    }
    const started = process.hrtime.bigint();
    const { machine } = sandbox;
    let run: ExecRun;
    try {
      run = new ExecRun(
        machine,
        { ...req, sandboxId: id, maxOutputBytes: this.options.maxExecOutputBytes },
        (why) => this.registry.markBroken(sandbox, machine, why),
      );
    } catch (err) {
      release();
      throw asMachineError(err, this.log, { sandbox: id }, 'vmOperationFailed', 'start the exec');
    }
    this.observer.execStarted?.();
    sandbox.trackRun(run);
    void run.done.then(() => {
      sandbox.touch();
      release();
      this.observer.execFinished?.(secondsSince(started));
    });
    return run;
  }

  /**
   * Sets sandbox `id`'s lifetime to `timeoutS` seconds from now (null: no limit), keeping what
   * happens at its end unless `onTimeout` is given (default `delete`). With `extendOnly`, an end
   * already later stays (E2B's connect). A paused sandbox keeps the lifetime for when it runs.
   */
  setTimeout(
    id: string,
    timeoutS: number | null,
    opts: { onTimeout?: Lifetime['onTimeout']; extendOnly?: boolean } = {},
  ): SandboxInfo {
    const sandbox = this.registry.get(id, false);
    if (timeoutS === null) {
      sandbox.setLifetime(null, null);
      return sandbox.info();
    }
    if (!(timeoutS > 0 && timeoutS <= MAX_LIFETIME_S)) {
      throw fail(
        'invalidField',
        'timeout',
        `a number of seconds in (0, ${MAX_LIFETIME_S}]`,
        timeoutS,
      );
    }
    const onTimeout = opts.onTimeout ?? sandbox.lifetime?.onTimeout ?? 'delete';
    let expiresAt = new Date(Date.now() + timeoutS * 1000);
    let lifetime: Lifetime = { timeoutS, onTimeout };
    if (opts.extendOnly && sandbox.lifetime) {
      if (sandbox.expiresAt && sandbox.expiresAt > expiresAt) expiresAt = sandbox.expiresAt;
      if (sandbox.lifetime.timeoutS > timeoutS)
        lifetime = { ...lifetime, timeoutS: sandbox.lifetime.timeoutS };
    }
    sandbox.setLifetime(lifetime, expiresAt);
    return sandbox.info();
  }

  /**
   * What sandbox `id` used, sampled every 5 s while it ran, in [fromMs, toMs] (core/
   * sandbox-metrics.ts); the last 30 minutes are kept.
   */
  metrics(id: string, fromMs?: number, toMs?: number): SandboxMetric[] {
    this.registry.get(id, false);
    return this.sampler.samples(id, fromMs, toMs);
  }

  /** Forks `id` into n copy-on-write children, all or nothing (core/lineage.ts). */
  async fork(id: string, n: number): Promise<Sandbox[]> {
    this.ensureRunning();
    this.options.cluster?.ensureConnected();
    const children = await this.lineage.fork(id, n);
    await this.placed(children.map((c) => c.id));
    return children;
  }

  /** The parent id adopts the winner's machine (core/lineage.ts). */
  merge(parentId: string, winnerId: string): Promise<SandboxInfo> {
    if (parentId !== winnerId) this.ensureRunning();
    return this.lineage.merge(parentId, winnerId);
  }

  /** Keeps the sandbox's whole state as a snapshot (named `name`, if given); the sandbox runs on. */
  async snapshot(id: string, name: string | null = null): Promise<SnapshotInfo> {
    this.ensureRunning();
    this.options.cluster?.ensureConnected();
    const info = await this.takeSnapshot(id, name);
    try {
      await this.options.cluster?.confirmSnapshot(info.snapshot_id);
    } catch (err) {
      this.snapshots.delete(info.snapshot_id);
      throw err;
    }
    return info;
  }

  /**
   * Captures the sandbox (with its turn held), then, with the sandbox running on and taking
   * execs again, makes the capture durable (its image's copy is most of a snapshot's bytes)
   * and only then writes the record: a snapshot whose id was answered survives a host crash.
   */
  private async takeSnapshot(id: string, name: string | null): Promise<SnapshotInfo> {
    const started = performance.now();
    const captured = await this.captureSnapshot(id);
    const kept = this.keepSnapshot(id, name, captured, performance.now() - started);
    this.snapshotsSyncing.add(kept);
    try {
      return await kept;
    } finally {
      this.snapshotsSyncing.delete(kept);
    }
  }

  /**
   * Resolves once every snapshot captured so far is kept or given up: one whose files still
   * sync is not listed yet, though its sandbox runs on (and may move to another node). A drain
   * waits for them before it lists the snapshots it moves, else one of them would be left on
   * the node it drained; shutdown, so that each is kept and answered before the servers close.
   */
  async snapshotsSettled(): Promise<void> {
    await Promise.allSettled([...this.snapshotsSyncing]);
  }

  /** The rest of `takeSnapshot`, after the capture (whose bytes it counts until it ends). */
  private async keepSnapshot(
    id: string,
    name: string | null,
    { state, source, size, prepared }: Awaited<ReturnType<SandboxManager['captureSnapshot']>>,
    captureMs: number,
  ): Promise<SnapshotInfo> {
    try {
      const syncStarted = performance.now();
      try {
        await this.hypervisor.persistState(state);
      } catch (err) {
        state.release();
        throw this.snapshotFailed(err, id);
      }
      const recordStarted = performance.now();
      const info = await this.snapshots.add(state, source, size, name);
      // Where a snapshot's time goes (docs/architecture.md, "Measured choices in the code").
      const ms = (from: number, to: number): number => Math.round((to - from) * 10) / 10;
      const timing = {
        captureMs: Math.round(captureMs * 10) / 10,
        syncMs: ms(syncStarted, recordStarted),
        recordMs: ms(recordStarted, performance.now()),
      };
      this.log.info(
        { sandbox: id, snapshot: info.snapshot_id, size, prepared, ...timing },
        'snapshot taken',
      );
      return info;
    } finally {
      this.syncingSnapshotBytes -= size;
    }
  }

  /** What a snapshot's capture or sync failing answers (and logs), as any machine failure. */
  private snapshotFailed(err: unknown, id: string): HostdError {
    return asMachineError(
      err,
      this.log,
      { sandbox: id },
      'vmOperationFailed',
      'snapshot the sandbox',
    );
  }

  /** The capture of a snapshot, under the sandbox's turn; the state comes with a reference. */
  private async captureSnapshot(id: string): Promise<{
    state: FrozenState;
    source: { id: string; template: string; allowOut: readonly string[] };
    size: number;
    prepared: boolean;
  }> {
    const { sandbox, release } = await this.registry.acquire(id, undefined, 'both');
    let tookTarget = false;
    try {
      this.ensureStorage(sandbox.machine.captureCostMib());
      // A fork's prepared copy of the base image, when one is ready (core/fork-standby.ts) and
      // no more than one machine, which the snapshot does not use, waits on it.
      const target = this.standby.takeImage(sandbox.machine.origin, 1);
      tookTarget = target !== null;
      const state = await sandbox.machine.capture(1, target).catch((err: unknown) => {
        if (!this.registry.holds(sandbox)) throw fail('sandboxDeleted', id);
        throw this.snapshotFailed(err, id);
      });
      await state.discardPrepared();
      sandbox.touch();
      const source = { id: sandbox.id, template: sandbox.template, allowOut: sandbox.allowOut };
      const size = this.hypervisor.stateSizeBytes(state);
      // Counted before the turn passes on: the sandbox's next snapshot or pause may start now.
      this.syncingSnapshotBytes += size;
      return { state, source, size, prepared: tookTarget };
    } finally {
      if (tookTarget) this.standby.refill();
      release();
    }
  }

  listSnapshots(): SnapshotInfo[] {
    return this.snapshots.list();
  }

  describeSnapshot(id: string): SnapshotInfo {
    return this.snapshots.describe(id);
  }

  /** The newest snapshot named `name`, or null. */
  snapshotByName(name: string): SnapshotInfo | null {
    return this.snapshots.byName(name);
  }

  deleteSnapshot(id: string): void {
    const to = this.snapshotsMoving.get(id);
    if (to !== undefined && this.snapshots.has(id)) {
      throw fail('sandboxMoving', `snapshot ${id}`, to);
    }
    this.snapshots.delete(id);
    this.log.info({ snapshot: id }, 'snapshot deleted');
  }

  /**
   * Writes the sandbox to disk and stops its machine; when it is paused already, only who paused
   * it changes (a client's pause of a sandbox hostd paused makes it the client's).
   */
  async pause(id: string, by: PauseReason = 'request'): Promise<SandboxInfo> {
    const sandbox = this.registry.get(id, true);
    const release = await sandbox.acquireAll();
    try {
      if (!this.registry.holds(sandbox)) throw fail('sandboxNotFound', id);
      if (sandbox.paused) {
        if (by === 'request') sandbox.repause(by);
        return sandbox.info();
      }
      await this.pauseHeld(sandbox, by);
      return sandbox.info();
    } finally {
      release();
    }
  }

  /**
   * Writes a running sandbox to disk and stops its machine, with its turn (both lanes) held: a
   * client's pause, and the source side of a hand-over, which pauses before it exports.
   */
  private async pauseHeld(sandbox: Sandbox, by: PauseReason): Promise<void> {
    const { id } = sandbox;
    // It may have failed while the caller waited for its turn.
    if (!sandbox.isRunning()) throw fail('sandboxBroken', id, sandbox.brokenReason ?? '');
    this.ensureStorage(0);
    const paused = await sandbox.machine.pause().catch((err: unknown) => {
      throw asMachineError(
        err,
        this.log,
        { sandbox: id },
        'vmOperationFailed',
        'pause the sandbox',
      );
    });
    if (sandbox.status.kind !== 'running') {
      // Its VM died as it was being written: what was written is not trusted.
      await paused.discard();
      throw fail('sandboxBroken', id, sandbox.brokenReason ?? '');
    }
    sandbox.pause(paused, by);
    // Its files are durable (Machine.pause); its record is once this resolves.
    await this.registry.flushRecords();
    this.log.info({ sandbox: id, bytes: paused.sizeBytes, by }, 'sandbox paused');
  }

  /** Runs a paused sandbox again; a no-op when it runs. */
  async resume(id: string): Promise<SandboxInfo> {
    this.ensureRunning();
    const { sandbox, release } = await this.registry.acquire(id);
    release();
    return sandbox.info();
  }

  /** Destroys the sandbox now; a running exec ends with an executor error, queued ones get 404. */
  async delete(id: string): Promise<void> {
    if (this.registry.forgetLost(id)) return;
    const sandbox = this.registry.get(id, false);
    const why = 'the sandbox was deleted';
    await this.destroyState(sandbox.delete(why, fail('sandboxDeleted', id)), why);
    this.log.info({ sandbox: id }, 'deleted');
  }

  /** Destroys what a deleted sandbox left: its machine, or its files on disk. */
  private async destroyState(was: SandboxState, why: string): Promise<void> {
    if (was.kind === 'running' || was.kind === 'failed') await was.machine.destroy(why);
    else if (was.kind === 'paused') await was.paused.discard();
  }

  /**
   * Stops taking work, writes every sandbox to disk (unless told not to), then destroys every
   * machine, pools included. A sandbox that cannot be paused is lost, and says so in the log.
   */
  async shutdown(): Promise<void> {
    this.stopping = true;
    this.reaper.stop();
    this.lifetimes.stop();
    this.sampler.stop();
    this.catalog.stopBuilding();
    await Promise.allSettled([...this.creating]);
    const all = this.registry.all();
    // Nothing queued will run; what runs is interrupted, so that the pause does not wait for it.
    for (const s of all) {
      s.queue.rejectWaiting(fail('shuttingDown'));
      s.fileQueue.rejectWaiting(fail('shuttingDown'));
      s.currentRun?.interrupt('hostd is shutting down');
    }
    if (this.options.pauseOnShutdown ?? true) await this.pauseAll(all);
    for (const s of all) s.close(fail('shuttingDown'));
    await Promise.all([
      ...all.map((s) => s.machine?.destroy('hostd is shutting down')),
      this.catalog.close(),
      this.standby.close(),
      // A snapshot captured before its sandbox's pause syncs with the turn released: kept and
      // answered before the servers close, as when the pause waited for the whole snapshot.
      this.snapshotsSettled(),
    ]);
    // Snapshots keep their references: letting go would delete files the next start reads.
  }

  /** The machine's console and log tail, for error reports and failing tests. */
  async logTail(id: string): Promise<string> {
    const { machine } = this.registry.get(id, false);
    return machine ? machine.logTail() : '(the sandbox is paused: no VM runs)';
  }

  /** Bytes snapshots (those still syncing too) and paused sandboxes take on disk. */
  storageBytes(): number {
    let n = this.snapshots.sizeBytes + this.syncingSnapshotBytes;
    for (const s of this.registry.all()) n += s.paused?.sizeBytes ?? 0;
    return n;
  }

  /**
   * Last steps before a new machine becomes a sandbox: refused once hostd stops, given the
   * sandbox's environment and network. On failure the machine is destroyed.
   */
  private async prepare(
    machine: Machine,
    env: CreateRequest['env'],
    allowOut: readonly string[],
  ): Promise<void> {
    try {
      if (this.stopping) throw fail('shuttingDown');
      await this.network.bind(machine, allowOut);
      if (env && Object.keys(env).length > 0) {
        await machine.setEnv(env).catch((err: unknown) => {
          throw asMachineError(
            err,
            this.log,
            { vm: machine.id },
            'vmOperationFailed',
            'set the environment',
          );
        });
      }
    } catch (err) {
      await machine.destroy();
      throw err;
    }
  }

  private async createFromSnapshot(
    snapshotId: string,
    env: CreateRequest['env'],
    allowOutGiven: readonly string[] | undefined,
    labels: Labels,
  ): Promise<Sandbox> {
    const fetch = this.options.cluster?.fetchSnapshot?.bind(this.options.cluster);
    if (fetch && isSnapshotId(snapshotId) && !this.snapshots.has(snapshotId)) {
      // Cluster mode, placed here without its files: a full node refuses before any is fetched.
      const admitted = this.admission.admit(1);
      try {
        await fetch(snapshotId);
      } finally {
        admitted();
      }
    }
    const { state, template, allowOut: inherited } = this.snapshots.get(snapshotId);
    const allowOut = allowOutGiven ?? inherited;
    const admitted = this.admission.admit(1);
    try {
      const machine = await this.hypervisor.restore(state).catch((err: unknown) => {
        this.observer.vmStartFailed?.();
        throw asMachineError(err, this.log, { template, snapshot: snapshotId }, 'vmStartFailed');
      });
      await this.prepare(machine, env, allowOut);
      return this.registry.adopt(machine, {
        template,
        parentId: null,
        snapshotId,
        allowOut,
        ...labels,
      });
    } finally {
      admitted();
    }
  }

  /**
   * Brings back the sandboxes the records name: paused ones as they were (resumed on first use),
   * running ones by re-adopting their VMs, which outlive a crash of hostd. A sandbox whose VM or
   * files are gone is lost: its id answers 410 until deleted. VMs of the earlier run that no
   * sandbox took over (pooled, standby) are then stopped.
   */
  private async readmitSandboxes(): Promise<void> {
    const records = this.options.records?.sandboxes;
    if (!records) return;
    let adopted = 0;
    for (const record of records.readAll((file, err) =>
      this.log.error({ file, err }, 'unreadable sandbox record'),
    )) {
      if (record.state === 'lost') {
        this.registry.markLost(record, record.error ?? 'its VM is gone');
        continue;
      }
      const origin = originOf(record);
      try {
        if (record.state === 'paused' && record.paused) {
          this.registry.readmit(record, origin, {
            kind: 'paused',
            paused: await this.hypervisor.openPaused(record.paused),
            at: new Date(record.paused_at ?? Date.now()),
            by: record.paused_by ?? null,
          });
        } else if (record.running) {
          const machine = await this.hypervisor.adopt(record.running);
          // Its lifetime ran on while hostd was down (the VM did): it ends when it would have.
          const expiresAt = record.expires_at ? new Date(record.expires_at) : null;
          const sandbox = this.registry.readmit(record, origin, {
            kind: 'running',
            machine,
            expiresAt,
          });
          // The old hostd's relayed connections went with it; the guest's listeners are reset.
          await this.network.bind(machine, sandbox.allowOut).catch((err: unknown) => {
            this.log.error({ err, sandbox: record.id }, 'could not set up the network');
          });
          adopted++;
        } else {
          this.registry.markLost(record, 'its record names no VM');
        }
      } catch (err) {
        // What the client reads (410 sandbox_lost) is the kind; the log has the raw text.
        const why = clientReason(err);
        this.registry.markLost(record, why);
        this.log.warn({ sandbox: record.id, err, why }, 'sandbox lost while hostd was down');
      }
    }
    const swept = await this.hypervisor.sweep();
    if (adopted || swept) this.log.info({ adopted, swept }, 're-adopted the VMs of the last run');
  }

  private async pauseAll(sandboxes: Sandbox[]): Promise<void> {
    const todo = sandboxes.filter((s) => s.isRunning());
    await eachAtOnce(todo, SHUTDOWN_PAUSES_AT_ONCE, async (sandbox) => {
      // Expected: a sandbox deleted (or merged away) since the list was made closes its
      // queue, and there is nothing left to pause.
      const release = await sandbox.acquireAll().catch(() => null);
      if (!release) return;
      try {
        if (!sandbox.isRunning() || !this.registry.holds(sandbox)) return;
        // Not pauseHeld(): at shutdown a full storage quota must not keep a sandbox from its pause.
        const paused = await sandbox.machine.pause();
        if (sandbox.status.kind === 'running') sandbox.pause(paused, 'shutdown');
        else await paused.discard(); // its VM died as it was written
      } catch (err) {
        this.log.error({ err, sandbox: sandbox.id }, 'could not pause on shutdown: it is lost');
      } finally {
        // Closed before the turn passes on: nothing queued since may resume it again.
        sandbox.close(fail('shuttingDown'));
        release();
      }
    });
    // One sync of the records' folder for every pause (their files are durable: Machine.pause).
    await this.registry.flushRecords();
    this.log.info({ sandboxes: sandboxes.length }, 'sandboxes paused for the next start');
  }

  /** 507 when snapshots and paused sandboxes would pass SERVICE_MAX_STORAGE_MIB. */
  private ensureStorage(moreMib: number): void {
    const full = storageCapRefusal(this.storageBytes(), moreMib, this.options.maxStorageMib ?? 0);
    if (full) throw full;
  }

  /** Cluster mode: the info says its node; a single hostd's info is as it always was. */
  private withNode(info: SandboxInfo): SandboxInfo {
    return this.nodeId === null ? info : { ...info, node: this.nodeId };
  }

  private get defaultTemplate(): string {
    return this.catalog.defaultName ?? '';
  }

  private ensureRunning(): void {
    if (this.stopping) throw fail('shuttingDown');
  }
}

/** What a record says a sandbox came from, and its labels (a restart's, a hand-over's). */
function originOf(record: SandboxRecord) {
  return {
    template: record.template,
    parentId: record.parent_id,
    snapshotId: record.snapshot_id,
    allowOut: record.allow_out ?? [],
    metadata: record.metadata ?? {},
    lifetime: record.lifetime
      ? { timeoutS: record.lifetime.timeout_s, onTimeout: record.lifetime.on_timeout }
      : null,
  };
}
