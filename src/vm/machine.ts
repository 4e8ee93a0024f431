/**
 * What the rest of hostd needs from virtual machines, and nothing more: `core` depends on these
 * interfaces only, never on QEMU, so its logic (queues, pools, fork and merge bookkeeping,
 * admission) is unit-tested in milliseconds against a fake (test/helpers/fake-hypervisor.ts),
 * and `QemuHypervisor` (vm/qemu/hypervisor.ts) is the one real implementation.
 *
 * The model: every running machine is a restore of an immutable `FrozenState` (a template's
 * frozen boot, or a fork point). A fork captures a running machine into a new FrozenState and
 * restores its children from it.
 *
 * Failures: every asynchronous method of `Hypervisor` and `Machine` rejects with a `VmError`
 * (vm/vm-error.ts): a kind from a small set (`died`, `agent_unresponsive`, `io`, ...) in a
 * client's terms, the operation, and the raw text and console tail for hostd's log only.
 * `deathReason` and the reasons given to `onDeath` and `ExecSink.onLost` are words of the vm
 * layer that a client may read (they never name host files).
 */
import type { EgressGate } from './channels/egress-gate.js';
import type { FileChannel } from './channels/file-channel.js';
import type { NetStats } from './channels/net-channel.js';
import type { ProcChannel } from './channels/proc-channel.js';

export type { EgressGate } from './channels/egress-gate.js';
export type { NetStats } from './channels/net-channel.js';
export {
  type Download,
  type ExtractResult,
  type FileEntry,
  FileChannelError,
  FileOpError,
  type Upload,
  type WriteResult,
  type DetailedEntry,
  type MkdirResult,
  type MoveResult,
  type UserWriteResult,
} from './channels/file-channel.js';
export {
  ProcChannelError,
  ProcOpError,
  type ProcErrorCode,
  type ProcessEnd,
  type ProcessInfo,
  type ProcessOutputStream,
  type ProcessSelector,
  type ProcessSink,
  type ProcessSpec,
  type ProcStream,
  type WatchEvent,
  type WatchEventType,
  type WatchSink,
  type WatchSpec,
} from './channels/proc-channel.js';
import type { TemplateSpec } from './image/image-builder.js';
export { VmError, type VmErrorKind, type VmOperation } from './vm-error.js';

export type Language = 'python' | 'bash';
export type OutputStream = 'stdout' | 'stderr';
/** Why hostd interrupts an exec; decides the exit code the guest reports (124 or 130). */
export type CancelReason = 'timeout' | 'client';

/** One exec as the guest runs it (docs/api.md, Exec). */
export interface ExecSpec {
  readonly language: Language;
  readonly code: string;
  /** Variables for this exec only, over the sandbox's default environment. */
  readonly env?: Readonly<Record<string, string>>;
  /** Working directory for this exec only. */
  readonly cwd?: string;
  /** Python: send rich outputs as display bundles. */
  readonly display?: boolean;
  /** Python: the REPL context to run in (docs/api.md, Contexts); absent: the default one. */
  readonly context?: string;
  /** Python: run as a notebook cell (docs/api.md, Notebook mode). */
  readonly notebook?: boolean;
}

/** A rich output: a MIME bundle as in Jupyter's display protocol. */
export type DisplayData = Readonly<Record<string, unknown>>;

/** A notebook cell's uncaught exception. */
export interface CellError {
  readonly name: string;
  readonly value: string;
  readonly traceback: string;
}

/** Receives one exec's output; exactly one of onExit / onLost is called, last. */
export interface ExecSink {
  /** One line (or piece of one: `partial`, notebook cells only) of output. */
  onOutput(stream: OutputStream, data: string, partial?: boolean): void;
  /** A rich output of a Python exec that asked for them (`display`, `notebook`). */
  onDisplay?(data: DisplayData): void;
  /** A notebook cell's value. */
  onResult?(data: DisplayData): void;
  /** A notebook cell's uncaught exception. */
  onError?(error: CellError): void;
  /**
   * The exec names a context or is a notebook cell, and runs: its first message. The count of
   * notebook cells its context ran, this one included; null for other execs.
   */
  onStart?(executionCount: number | null): void;
  /** The guest did not run the exec (`context_not_found`); onExit follows. */
  onRejected?(reason: string): void;
  onExit(code: number): void;
  /** The machine died or its channel closed before the exec's exit arrived. */
  onLost(reason: string): void;
}

/** A request about a machine's REPL contexts (docs/api.md, Contexts). */
export type ContextRequest =
  | { readonly action: 'list' }
  | { readonly action: 'create'; readonly context?: string; readonly cwd?: string }
  | { readonly action: 'delete' | 'restart'; readonly context: string };

/** One REPL context, as the guest describes it. */
export interface ContextInfo {
  readonly id: string;
  readonly cwd: string;
  readonly execution_count: number;
}

/** The guest's answer to a ContextRequest: what it asked for, or why it could not be served. */
export interface ContextAnswer {
  readonly contexts?: readonly ContextInfo[];
  readonly context?: ContextInfo;
  /** `context_not_found`, `context_exists`, `context_is_default`, `invalid_cwd`, ... */
  readonly error?: { readonly code: string; readonly message: string };
}

/**
 * A machine's files, read and written while execs run (vm/channels/file-channel.ts). One operation at a
 * time: the caller queues them (core's file lane).
 */
export type GuestFiles = Pick<
  FileChannel,
  | 'writeFile'
  | 'readFile'
  | 'tarOut'
  | 'tarIn'
  | 'list'
  | 'stat'
  | 'mkdir'
  | 'remove'
  | 'move'
  | 'writeFileAs'
  | 'readFileAs'
  | 'statAs'
  | 'listAs'
  | 'mkdirAs'
  | 'removeAs'
>;

/**
 * A machine's processes and directory watches (vm/channels/proc-channel.ts): many at once, next
 * to execs and file operations, each a stream with its own flow control.
 */
export type GuestProcesses = Pick<
  ProcChannel,
  'start' | 'connect' | 'watch' | 'list' | 'input' | 'closeStdin' | 'signal'
>;

/** What a machine's guest may reach (vm/channels/net-channel.ts). */
export interface NetworkPolicy {
  /** Judges every connection the guest opens. */
  readonly gate: EgressGate;
  /** Ports of host.hostd.internal the guest listens on (those its rules allow). */
  readonly hostPorts: readonly number[];
}

/** What a running machine costs the host now, read cheaply (no guest round trip). */
export interface MachineUsage {
  /** CPU seconds (user + system) its hypervisor process has used since it started. */
  readonly cpuSeconds: number;
  /** Host memory its hypervisor process holds: its resident set, in bytes. */
  readonly memoryBytes: number;
  /** Bytes its writable disk takes on the host: what the guest wrote, its layers included. */
  readonly diskBytes: number;
}

/** A running VM, as a sandbox drives it. */
export interface Machine {
  /** For logs and metrics; not a sandbox id. */
  readonly id: string;
  /** False once it died or was destroyed. */
  readonly alive: boolean;
  /** Why it is not alive, for error messages. */
  readonly deathReason: string;
  /**
   * The frozen state this machine was restored from, while it is still running as a pristine
   * copy-on-write restore of it: forks of it can then use work prepared for that state ahead of
   * time (`ForkTarget`). Null for machines that are not restores.
   */
  readonly origin: FrozenState | null;

  /** `listener` is called once if the machine dies by itself (not on destroy). Replaces any. */
  onDeath(listener: ((why: string) => void) | null): void;
  /** Starts an exec; returns its id for `cancel`. */
  exec(spec: ExecSpec, sink: ExecSink): number;
  cancel(execId: number, reason: CancelReason): void;
  /**
   * Whether the guest still answers, within `timeoutMs`, in a way that proves it can end an
   * exec: asked when a cancel takes long, to tell a slow guest from a wedged one. Never rejects.
   */
  ping(timeoutMs: number): Promise<boolean>;
  /**
   * Serves a request about the REPL's contexts, in turn with the Python execs (the caller
   * holds the sandbox's turn). Rejects when the guest does not answer.
   */
  contexts(request: ContextRequest): Promise<ContextAnswer>;
  /**
   * Sets the sandbox's default environment in the guest (every later exec starts from it); it
   * replaces the previous one. Resolves once the guest will apply it to the next exec.
   */
  setEnv(env: Readonly<Record<string, string>>): Promise<void>;
  readonly files: GuestFiles;
  /**
   * Its processes port. Throws ProcChannelError 'unavailable' on a machine restored from a
   * state that predates the port (a snapshot or a paused sandbox of an earlier hostd).
   */
  readonly processes: GuestProcesses;
  /**
   * Applies the sandbox's network rules and resets the guest's connections. Call on every
   * machine a sandbox gets (new, restored, resumed, adopted): until then the guest reaches
   * nothing. Resolves once the guest listens on `hostPorts`.
   */
  setNetwork(policy: NetworkPolicy): Promise<void>;
  /** Bytes the guest exchanged with the outside since this machine started. */
  networkStats(): NetStats;
  /**
   * MiB of host memory that are this machine's own (pages it wrote, its hypervisor's buffers),
   * not shared with the state it was restored from; null when that cannot be read (it exited).
   * Cheap enough to call for every sandbox of a listing.
   */
  ownMemoryMib(): number | null;
  /** Stop / resume reading the guest's output: backpressure from a slow client. */
  pauseOutput(): void;
  resumeOutput(): void;
  /**
   * Runs one exec that leaves nothing in the user's namespace (`print(1)`), so that a pooled
   * machine's first real exec is not its slowest.
   */
  warmUp(): Promise<void>;
  /**
   * Captures the machine's whole state at one instant into a new FrozenState for `children`
   * restores. The machine is paused only for the final copy and keeps running. `target`, when
   * given, is work prepared ahead for forks of this machine's origin; it is consumed.
   */
  capture(children: number, target: ForkTarget | null): Promise<FrozenState>;
  /** MiB of host memory a capture of this machine writes (an admission estimate). */
  captureCostMib(): number;
  /**
   * Writes the machine to disk (the memory pages it changed since its origin, its device state)
   * and stops it: it then costs no host memory. `resume` brings it back. On failure the machine
   * runs on as before and nothing is left on disk (only a failure of the host's disk once the
   * machine's files are in place loses the machine). Once it resolves, the paused machine (and
   * what it needs: its origin state) survives a host crash.
   */
  pause(): Promise<PausedMachine>;
  /** Kills the machine and frees its files. Idempotent. A running exec is lost with `reason`. */
  destroy(reason?: string): Promise<void>;
  /** The guest console and hypervisor log tail, for error reports and failing tests. */
  logTail(): Promise<string>;
  /**
   * What the machine costs the host now (the sandbox metrics the E2B front serves). Optional:
   * a machine that cannot tell has none; it throws once the machine is gone. Synchronous, and
   * must stay cheap (a few O(1) reads of /proc and file sizes): it runs on hostd's event loop
   * for every running sandbox every 5 s (core/sandbox-metrics.ts).
   */
  usage?(): MachineUsage;
  /** What to store so that a hostd that restarts after a crash can re-adopt it (`adopt`). */
  describe(): MachineDescriptor;
}

/** How a running machine is named in records: plain JSON only the hypervisor interprets. */
export interface MachineDescriptor {
  readonly format: number;
  readonly id: string;
  readonly pid: number;
  /** The state it was restored from (its memory is that state's image plus its own pages). */
  readonly origin: StateDescriptor;
  /** Its writable disk, when it has one (the hypervisor keeps the disk's chain). */
  readonly disk?: string;
}

/**
 * Waits for a turn to run a restored guest (Hypervisor.restore); rejects to give the restore
 * up. Whoever gives the turn ends it, once the restore has settled (core/lineage.ts).
 */
export type RunTurn = () => Promise<void>;

/**
 * An immutable machine state that machines are restored from. Reference-counted: its files
 * are freed when the last holder (a pool, a restored machine, a fork in progress) lets go.
 */
export interface FrozenState {
  readonly id: string;
  /** Takes a reference; returns this for chaining. */
  retain(): this;
  release(): void;
  /**
   * Stops the incoming machines a capture brought for restores of this state and no restore
   * used (a fork with fewer children than incoming machines). Call once the restores are over.
   */
  discardPrepared(): Promise<void>;
}

/** A machine written to disk by `Machine.pause`, until it is resumed or discarded. */
export interface PausedMachine {
  /** Bytes it takes on disk (its own files, not its origin's). */
  readonly sizeBytes: number;
  /** What to store to reopen it after a restart (`Hypervisor.openPaused`). */
  describe(): PausedDescriptor;
  /** Deletes its files and lets go of its origin. */
  discard(): Promise<void>;
}

/** How a paused machine is named in records: plain JSON only the hypervisor interprets. */
export interface PausedDescriptor {
  readonly format: number;
  readonly id: string;
  readonly origin: StateDescriptor;
}

/**
 * How a frozen state is named in records that outlive hostd (a snapshot's, a paused sandbox's
 * origin): plain JSON that only the hypervisor interprets, and reopens with `openState`.
 */
export interface StateDescriptor {
  /** Bumped when states change incompatibly; a hypervisor refuses formats it does not read. */
  readonly format: number;
  readonly id: string;
  readonly spec: unknown;
}

/**
 * Work done ahead for the next fork of a machine restored from `base`: for QEMU, a copy of the
 * base image and hypervisor processes already started on it. Made and sized by core's fork
 * standby policy; consumed by `Machine.capture`.
 */
export interface ForkTarget {
  readonly base: FrozenState;
  /** Incoming machines: started, waiting in this target for a fork's state. */
  readonly incoming: number;
  /** Starts one more incoming machine. */
  addIncoming(): Promise<void>;
  /** Frees what was prepared, when no fork took it. */
  discard(): Promise<void>;
}

/** The resources of one template's machines. */
export interface MachineShape {
  readonly memoryMib: number;
  readonly vcpus: number;
}

/**
 * A template's built guest image (vm/image/template-images.ts), handed back to `bootTemplate`. Core
 * reads only what the templates API shows; the rest is the hypervisor's business.
 */
export interface TemplateImage {
  /** Identifies the build: frozen states made from one key never restore on another. */
  readonly key: string;
  /** When it was built (ISO 8601). */
  readonly builtAt: string;
  /** Size of each machine's writable disk; fixed by the build. */
  readonly diskMib: number;
  /** Names of the Debian packages the recipe asked for and every template's base ones. */
  readonly debianPackages: readonly string[];
  /** Names of what pip installed, dependencies included. */
  readonly pythonPackages: readonly string[];
  /** Modules the template's REPL imported before it was frozen. */
  readonly preload: readonly string[];
  /** Python the template's REPL ran after its preloads, before it was frozen ('' for none). */
  readonly warmup: string;
}

/**
 * Finds and builds templates' images from their recipes. Core drives it (which template, when,
 * one at a time) without knowing the build scripts or the cache layout.
 */
export interface TemplateImages {
  /** The cached build of `recipe`, or null when it has not been built; builds nothing. */
  find(recipe: TemplateSpec): Promise<TemplateImage | null>;
  /**
   * Builds `recipe` (minutes for a large one). Rejects with an Error whose message says why,
   * for a client to read: the failing step and the end of its log, with no host directory in
   * it (the cache directory reads `$SERVICE_CACHE_DIR`); its `cause` is the whole error, for the
   * log. `signal` stops the build.
   */
  build(recipe: TemplateSpec, signal: AbortSignal): Promise<TemplateImage>;
  /**
   * The end of the last build's log of `recipe` (the failing step's output, or the progress of a
   * build running now); null when it was never built here.
   */
  buildLog(recipe: TemplateSpec): Promise<string | null>;
}

/** Makes machines. */
export interface Hypervisor {
  /**
   * The frozen state every sandbox of a template restores, with a reference for the caller:
   * from the template cache on disk when an earlier run left one for exactly this machine,
   * else by cold-booting the template, preparing it and freezing it into that cache. `image` is
   * what `TemplateImages` gave for the template: the cache is keyed by it, so a rebuilt template
   * is booted afresh.
   */
  bootTemplate(template: string, shape: MachineShape, image: TemplateImage): Promise<FrozenState>;
  /** The descriptor to store for `state`. */
  describeState(state: FrozenState): StateDescriptor;
  /** The state a stored descriptor names (no reference added: the caller retains it). */
  openState(descriptor: StateDescriptor): Promise<FrozenState>;
  /**
   * Deletes frozen states on disk that no open state uses. Call after every record has
   * reopened what it needs; returns how many were removed.
   */
  collectGarbage(): Promise<number>;
  /**
   * A new running machine in `state` (copy-on-write: it costs only what it writes). `turn`, when
   * given, is awaited after the machine's own set-up and before its guest runs: a fork runs a
   * few children's guests at a time this way, their set-up ahead (core/lineage.ts).
   */
  restore(state: FrozenState, turn?: RunTurn): Promise<Machine>;
  /**
   * The paused machine running again, as it was. The paused files are deleted once it runs; on
   * failure they are kept, and `paused` can be resumed again or discarded.
   */
  resume(paused: PausedMachine): Promise<Machine>;
  /** The paused machine a stored descriptor names, after a restart. */
  openPaused(descriptor: PausedDescriptor): Promise<PausedMachine>;
  /**
   * Takes over a machine that an earlier hostd started and that outlived it (a crash): it
   * reconnects to it and ends whatever it was running for clients that are gone. Fails when the
   * machine is not running any more.
   */
  adopt(descriptor: MachineDescriptor): Promise<Machine>;
  /** Stops every machine of earlier runs that no `adopt` took over, and removes their files. */
  sweep(): Promise<number>;
  /** Starts preparing the next fork of machines restored from `base`. */
  prepareForkTarget(base: FrozenState): Promise<ForkTarget>;
  /** Estimated host memory (MiB) of one idle machine: what admission reserves per VM. */
  readonly machineOverheadMib: number;
  /** MiB of host memory a prepared fork target for `base` costs (its image copy). */
  forkTargetCostMib(base: FrozenState): number;
  /** Bytes `state` takes on disk (a snapshot's size). */
  stateSizeBytes(state: FrozenState): number;
  /**
   * Makes `state` survive a host crash: its files and everything it needs to be reopened
   * (`openState`), synced to disk. A capture is not durable (a fork's children do not outlive
   * the host); a snapshot calls this before its record is written. A paused machine (`pause`,
   * `importPaused`) and an imported state (`importState`) are durable already.
   */
  persistState(state: FrozenState): Promise<void>;
  /**
   * Everything another node needs to reopen `paused` (a hand-over, docs/cluster.md): its own
   * files, its origin state's and its disk layer chain's, each with its size and sha256. Ids are
   * unique and kept, so the target reuses what it already has by id.
   */
  exportPaused(paused: PausedMachine): Promise<PausedManifest>;
  /**
   * A file an export listed, for a peer to read from byte `offset` (the peer file route).
   * Rejects with `unsupported` for a path that is no exported kind of file.
   */
  readExported(path: string, offset: number): Promise<ExportedRead>;
  /**
   * Makes the paused machine `manifest` describes exist here, fetching through `fetch` only the
   * parts this node lacks (each file checked against its size and sha256 before it is put in
   * place), and opens it. A template build the machine runs on that this node lacks (its own
   * build of the template differs, or it has none) is fetched too and kept for as long as a
   * state here uses it (`ExportedBuild`). Rejects with `state_corrupt` for a file whose checksum
   * differs, or a state whose build this node has not and the export does not carry, and
   * leaves nothing half-imported.
   */
  importPaused(manifest: PausedManifest, fetch: FileFetcher): Promise<PausedMachine>;
  /**
   * Everything another node needs to reopen frozen state `state` (a snapshot handed over at a
   * drain, docs/cluster.md): the state's files and its disk layer chain's, as `exportPaused`
   * lists a paused machine's origin.
   */
  exportState(state: FrozenState): Promise<StateManifest>;
  /**
   * Makes the frozen state `manifest` describes exist here, fetching only the parts this node
   * lacks (checked as `importPaused` checks them), and opens it. The caller retains it. Rejects
   * as `importPaused` does.
   */
  importState(manifest: StateManifest, fetch: FileFetcher): Promise<FrozenState>;
}

/** One file of an export, named relative to the exporting node's data directory. */
export interface ExportedFile {
  readonly path: string;
  readonly size: number;
  readonly sha256: string;
}

/**
 * A unit an import takes whole or not at all: a frozen state, a disk layer, or the paused
 * machine's own folder. A target that has one by id skips its files.
 */
export interface ExportedPart {
  readonly kind: 'state' | 'layer' | 'paused';
  readonly id: string;
  readonly files: readonly ExportedFile[];
}

/**
 * The template build an exported state runs on (its boot image, root filesystem and empty
 * disk, as the exporting node's image cache holds them): a target whose own build of the
 * template differs, or that has none, fetches these files and restores onto them, since a
 * state's memory holds the page cache of its own build's root filesystem. Identified by its
 * key and its files' sha256, never by its key alone: the same key built on two hosts at
 * different times can hold other package versions.
 */
export interface ExportedBuild {
  /** The template it is a build of (its manifest's `name`). */
  readonly template: string;
  /** The build's key (the image key the state's spec names). */
  readonly key: string;
  /** Its files, named relative to the exporting node's image cache (`cache/...`). */
  readonly files: readonly ExportedFile[];
}

/** What `exportPaused` gives and `importPaused` takes: plain JSON, sent between nodes. */
export interface PausedManifest {
  readonly format: number;
  readonly paused: PausedDescriptor;
  /** In the order an import puts them in place: what a part reads comes before it. */
  readonly parts: readonly ExportedPart[];
  /**
   * The template build the machine runs on; absent from the exports of older nodes and of
   * states whose build is not in the exporting node's image cache (the target must then hold
   * that very build where the state names it).
   */
  readonly build?: ExportedBuild;
}

/** What `exportState` gives and `importState` takes: plain JSON, sent between nodes. */
export interface StateManifest {
  readonly format: number;
  readonly state: StateDescriptor;
  /** In the order an import puts them in place; no part is of kind `paused`. */
  readonly parts: readonly ExportedPart[];
  /** The template build the state runs on, as in `PausedManifest`. */
  readonly build?: ExportedBuild;
}

/** An exported file being read: its whole size, and its bytes from the offset asked. */
export interface ExportedRead {
  readonly size: number;
  readonly stream: NodeJS.ReadableStream & { destroy(): void };
}

/**
 * Fetches `file`'s bytes from byte `offset` on (the node that exported it); an import resumes
 * a file it had begun from where it stopped. Rejections pass through the import unchanged.
 */
export type FileFetcher = (
  file: ExportedFile,
  offset: number,
) => Promise<AsyncIterable<Uint8Array>>;
