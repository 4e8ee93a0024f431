/**
 * An in-memory Hypervisor (src/vm/machine.ts) for unit tests of core: machines are plain
 * objects with a key-value "memory", execs are a tiny command language, and every step a test
 * needs to order (a restore, an exec's end) can be held until the test lets it go. No QEMU, no
 * timing: core's queues, pools, fork and merge bookkeeping and admission run in milliseconds.
 *
 * Exec language (one command per exec):
 *   `set K V`  stores V under K, prints nothing      `get K`  prints the value of K (or `None`)
 *   `print T`  prints T                                `fail`   exits 1
 *   `env K`    prints variable K of the default environment with the exec's `env` over it
 *   `show T`   a display bundle with text/plain T
 *   `hang`     never ends by itself: only a cancel (124/130) or the machine's death ends it
 *   `deaf`     as hang, but a cancel does not end it either (a slow or wedged guest): the
 *              test ends it with `finish`; the guest answers pings while `answersPings`
 *   `die`      the machine dies while running it
 *   `value T`  a notebook result with text/plain T     `raise N V`  a cell error N: V, exits 1
 * Processes (`machine.processes`): test/helpers/fake-processes.ts.
 *
 * Contexts (docs/api.md, Contexts) live in the memory, so forks copy them: `ctx:ID` holds a
 * context's cwd (`default` always exists) and `count:ID` its notebook cells. An exec naming a
 * context that does not exist is rejected; one naming a context, or a notebook cell, starts
 * with onStart.
 *
 * Failures are VmErrors, as the port says (src/vm/machine.ts); `failNext` injects one into a
 * step, with the raw text a test chooses (a host path, to check that clients never see it).
 */
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type {
  CancelReason,
  ContextAnswer,
  ContextInfo,
  ContextRequest,
  ExecSink,
  ExecSpec,
  ForkTarget,
  FrozenState,
  Hypervisor,
  Machine,
  MachineUsage,
  MachineDescriptor,
  MachineShape,
  NetStats,
  NetworkPolicy,
  ExportedBuild,
  ExportedRead,
  ExportedFile,
  FileFetcher,
  PausedDescriptor,
  PausedMachine,
  PausedManifest,
  RunTurn,
  StateDescriptor,
  StateManifest,
  TemplateImage,
} from '../../src/vm/machine.js';
import { ProcChannelError, VmError } from '../../src/vm/machine.js';
import { FakeFiles } from './fake-files.js';
import { FakeProcesses } from './fake-processes.js';

let ids = 0;

export class FakeState implements FrozenState {
  refs = 0;
  constructor(
    readonly id: string,
    readonly memory: ReadonlyMap<string, string>,
    readonly template: string,
    /** The template build (image key) it runs on. */
    readonly build = `key-${template}`,
  ) {}

  retain(): this {
    this.refs++;
    return this;
  }

  release(): void {
    this.refs--;
  }

  async discardPrepared(): Promise<void> {}
}

export class FakeMachine implements Machine {
  readonly id = `fake-${++ids}`;
  readonly memory: Map<string, string>;
  private dead: string | null = null;
  destroyed = false;
  private listener: ((why: string) => void) | null = null;
  private nextExec = 1;
  /** Execs that have not ended: id -> sink. */
  readonly running = new Map<number, ExecSink>();
  /** Every exec this machine was given, in order. */
  readonly execLog: string[] = [];
  outputPaused = false;
  /** Whether the guest answers `ping` (a slow guest does, a wedged one does not). */
  answersPings = true;
  /** How many times the guest was pinged. */
  pings = 0;
  readonly files: FakeFiles;
  /** The last network policy applied, and how many times one was. */
  network: NetworkPolicy | null = null;
  networkResets = 0;
  readonly procs = new FakeProcesses();
  /** False: the machine predates the processes port (its `processes` throws). */
  hasProcessPort = true;

  constructor(
    private readonly hv: FakeHypervisor,
    readonly origin: FakeState,
  ) {
    this.memory = new Map(origin.memory);
    origin.retain();
    this.files = new FakeFiles(
      this.memory,
      () => hv.gate('file'),
      () => hv.fault('file', this),
    );
  }

  get processes(): FakeProcesses {
    if (!this.hasProcessPort) {
      throw new ProcChannelError('unavailable', 'the machine has no processes port');
    }
    return this.procs;
  }

  /** What the metrics sampler reads: fixed figures, the memory held growing with its keys. */
  usage(): MachineUsage {
    if (this.dead !== null || this.destroyed) throw new Error('the machine is gone');
    return { cpuSeconds: 0, memoryBytes: (64 + this.memory.size) << 20, diskBytes: 1 << 20 };
  }

  async setNetwork(policy: NetworkPolicy): Promise<void> {
    if (!this.alive) throw new VmError('died', this.deathReason);
    this.network = policy;
    this.networkResets++;
  }

  networkStats(): NetStats {
    return { bytesOut: 0, bytesIn: 0, openConnections: 0, waitingOnGuest: 0 };
  }

  /** What `ownMemoryMib` reports while the machine is alive. */
  memoryMib = 12.5;

  ownMemoryMib(): number | null {
    return this.alive ? this.memoryMib : null;
  }

  get alive(): boolean {
    return this.dead === null && !this.destroyed;
  }

  get deathReason(): string {
    return this.dead ?? (this.destroyed ? 'destroyed' : 'running');
  }

  onDeath(listener: ((why: string) => void) | null): void {
    this.listener = listener;
  }

  exec(spec: ExecSpec, sink: ExecSink): number {
    const id = this.nextExec++;
    this.execLog.push(spec.code);
    if (!this.alive) {
      queueMicrotask(() => sink.onLost(this.deathReason));
      return id;
    }
    this.running.set(id, sink);
    const [cmd, ...args] = spec.code.split(' ');
    queueMicrotask(() => {
      const end = (code: number): void => {
        if (this.running.delete(id)) sink.onExit(code);
      };
      const context = spec.context ?? 'default';
      if (context !== 'default' && !this.memory.has(`ctx:${context}`)) {
        sink.onRejected?.('context_not_found');
        end(1);
        return;
      }
      if (spec.notebook || spec.context !== undefined) {
        let count: number | null = null;
        if (spec.notebook) {
          count = Number(this.memory.get(`count:${context}`) ?? '0') + 1;
          this.memory.set(`count:${context}`, String(count));
        }
        sink.onStart?.(count);
      }
      if (cmd === 'value') {
        sink.onResult?.({ 'text/plain': args.join(' ') });
        end(0);
      } else if (cmd === 'raise') {
        sink.onError?.({
          name: args[0]!,
          value: args.slice(1).join(' '),
          traceback: 'Traceback',
        });
        end(1);
      } else if (cmd === 'set') {
        this.memory.set(args[0]!, args.slice(1).join(' '));
        end(0);
      } else if (cmd === 'get') {
        sink.onOutput('stdout', this.memory.get(args[0]!) ?? 'None');
        end(0);
      } else if (cmd === 'print') {
        sink.onOutput('stdout', args.join(' '));
        end(0);
      } else if (cmd === 'env') {
        sink.onOutput('stdout', { ...this.env, ...spec.env }[args[0]!] ?? 'None');
        end(0);
      } else if (cmd === 'show') {
        sink.onDisplay?.({ 'text/plain': args.join(' ') });
        end(0);
      } else if (cmd === 'fail') {
        end(1);
      } else if (cmd === 'die') {
        this.die('the VM exited (signal SIGKILL)');
      } else if (cmd !== 'hang' && cmd !== 'deaf') {
        sink.onOutput('stderr', `unknown command ${spec.code}`);
        end(2);
      }
    });
    return id;
  }

  cancel(execId: number, reason: CancelReason): void {
    const sink = this.running.get(execId);
    if (!sink || this.execLog[execId - 1] === 'deaf') return;
    this.running.delete(execId);
    queueMicrotask(() => sink.onExit(reason === 'timeout' ? 124 : 130));
  }

  /** Ends exec `execId` with `code`, as the guest finally does (a `deaf` exec). */
  finish(execId: number, code: number): void {
    const sink = this.running.get(execId);
    if (this.running.delete(execId)) sink!.onExit(code);
  }

  async ping(): Promise<boolean> {
    this.pings++;
    return this.alive && this.answersPings;
  }

  async contexts(request: ContextRequest): Promise<ContextAnswer> {
    await this.hv.gate('context');
    if (!this.alive) throw new VmError('died', this.deathReason);
    const info = (id: string): ContextInfo => ({
      id,
      cwd: this.memory.get(`ctx:${id}`) ?? '/root',
      execution_count: Number(this.memory.get(`count:${id}`) ?? '0'),
    });
    const exists = (id: string): boolean => id === 'default' || this.memory.has(`ctx:${id}`);
    const notFound = (id: string): ContextAnswer => ({
      error: { code: 'context_not_found', message: `context ${id} not found` },
    });
    if (request.action === 'list') {
      const ids = [...this.memory.keys()].filter((k) => k.startsWith('ctx:'));
      return { contexts: ['default', ...ids.map((k) => k.slice(4))].map(info) };
    }
    if (request.action === 'create') {
      const id = request.context ?? `auto${this.nextExec++}`;
      if (exists(id)) {
        return { error: { code: 'context_exists', message: `context ${id} already exists` } };
      }
      if (request.cwd !== undefined && !request.cwd.startsWith('/')) {
        return { error: { code: 'invalid_cwd', message: `cwd ${request.cwd}` } };
      }
      this.memory.set(`ctx:${id}`, request.cwd ?? '/root');
      return { context: info(id) };
    }
    if (!exists(request.context)) return notFound(request.context);
    if (request.action === 'restart') {
      this.memory.delete(`count:${request.context}`);
      return { context: info(request.context) };
    }
    if (request.context === 'default') {
      return { error: { code: 'context_is_default', message: 'the default context' } };
    }
    this.memory.delete(`ctx:${request.context}`);
    this.memory.delete(`count:${request.context}`);
    return {};
  }

  /** The default environment the guest was given (`setEnv`). */
  env: Readonly<Record<string, string>> = {};

  async setEnv(env: Readonly<Record<string, string>>): Promise<void> {
    this.hv.fault('setEnv', this);
    this.env = env;
  }

  pauseOutput(): void {
    this.outputPaused = true;
  }

  resumeOutput(): void {
    this.outputPaused = false;
  }

  async warmUp(): Promise<void> {
    if (!this.alive) throw new VmError('died', this.deathReason);
  }

  async capture(children: number, target: ForkTarget | null): Promise<FrozenState> {
    await this.hv.gate('capture');
    this.hv.fault('capture', this);
    if (!this.alive) throw new VmError('died', `cannot capture: ${this.deathReason}`);
    this.hv.captures.push({ machine: this.id, children, target: target !== null });
    if (target) await target.discard();
    const { template, build } = this.origin;
    return new FakeState(`fork-${++ids}`, new Map(this.memory), template, build).retain();
  }

  captureCostMib(): number {
    return 10;
  }

  async pause(): Promise<PausedMachine> {
    await this.hv.gate('pause');
    this.hv.fault('pause', this);
    if (!this.alive) throw new VmError('died', `cannot pause: ${this.deathReason}`);
    const paused = new FakePaused(this.hv, new Map(this.memory), this.origin.retain());
    await this.destroy('the sandbox was paused');
    return paused;
  }

  /** The machine dies by itself, as a crashed QEMU would. */
  die(why: string): void {
    if (!this.alive) return;
    this.dead = why;
    const sinks = [...this.running.values()];
    this.running.clear();
    for (const s of sinks) s.onLost(why);
    this.procs.lose(why);
    this.listener?.(why);
  }

  async destroy(reason = 'destroyed'): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    const sinks = [...this.running.values()];
    this.running.clear();
    for (const s of sinks) s.onLost(reason);
    this.procs.lose(reason);
    this.origin.release();
    this.hv.destroyedIds.push(this.id);
  }

  async logTail(): Promise<string> {
    return `log of ${this.id}`;
  }

  describe(): MachineDescriptor {
    return {
      format: 1,
      id: this.id,
      pid: 0,
      origin: { format: 1, id: this.origin.id, spec: null },
    };
  }

  /** What a new hostd's adoption does: the machine runs on, what it ran is cancelled. */
  takeOver(): void {
    for (const [id] of this.running) this.cancel(id, 'client');
  }
}

export class FakePaused implements PausedMachine {
  readonly sizeBytes = 4096;
  discarded = false;
  constructor(
    private readonly hv: FakeHypervisor,
    readonly memory: ReadonlyMap<string, string>,
    readonly origin: FakeState,
    readonly id = `pause-${++ids}`,
  ) {
    hv.pausedOnDisk.set(this.id, this);
  }

  describe(): PausedDescriptor {
    return { format: 1, id: this.id, origin: { format: 1, id: this.origin.id, spec: null } };
  }

  async discard(): Promise<void> {
    if (this.discarded) return;
    this.discarded = true;
    this.hv.pausedOnDisk.delete(this.id);
    this.origin.release();
  }
}

class FakeTarget implements ForkTarget {
  incoming = 0;
  discarded = false;
  constructor(readonly base: FrozenState) {}

  async addIncoming(): Promise<void> {
    this.incoming++;
  }

  async discard(): Promise<void> {
    this.discarded = true;
  }
}

/** `guest`: a restored guest running to its hello, inside its turn (Hypervisor.restore). */
type Step =
  'guest' | 'restore' | 'capture' | 'persist' | 'boot' | 'pause' | 'resume' | 'file' | 'context';
/** Steps `failNext` can make fail. */
export type FaultStep =
  | 'restore'
  | 'resume'
  | 'capture'
  | 'pause'
  | 'setEnv'
  | 'adopt'
  /** Any of a machine's file operations (FakeFiles). */
  | 'file';

export class FakeHypervisor implements Hypervisor {
  readonly machineOverheadMib = 50;
  readonly machines: FakeMachine[] = [];
  readonly destroyedIds: string[] = [];
  readonly captures: { machine: string; children: number; target: boolean }[] = [];
  readonly targets: FakeTarget[] = [];
  /** Restores that throw instead of starting, counted down. */
  failNextRestores = 0;
  /** Templates whose boot throws. */
  readonly failingBoots = new Set<string>();
  /** Every template booted, with the key of the image it booted. */
  readonly boots: { template: string; key: string }[] = [];
  private readonly held = new Map<Step, { waiters: (() => void)[] }>();

  async bootTemplate(
    template: string,
    _shape: MachineShape,
    image: TemplateImage,
  ): Promise<FrozenState> {
    await this.gate('boot');
    if (this.failingBoots.has(template)) {
      throw new VmError('start_failed', 'the VM failed to boot (fake)', { operation: 'boot' });
    }
    this.boots.push({ template, key: image.key });
    this.builds.add(image.key);
    return new FakeState(`template-${template}`, new Map(), template, image.key).retain();
  }

  /** Restored guests running to their hello now (inside their turn), and the most at once. */
  guestsRunning = 0;
  guestsPeak = 0;
  /** Restored guests that ran in a turn (a fork's children), in all. */
  guestsRun = 0;
  /** Restores that throw while their guest runs (inside its turn), counted down. */
  failNextGuests = 0;

  async restore(state: FrozenState, turn?: RunTurn): Promise<FakeMachine> {
    await this.gate('restore');
    this.fault('restore', null);
    if (this.failNextRestores > 0) {
      this.failNextRestores--;
      throw new VmError('start_failed', 'the VM failed to start (fake)', { operation: 'restore' });
    }
    if (turn) {
      await turn();
      this.guestsRun++;
    }
    this.guestsPeak = Math.max(this.guestsPeak, ++this.guestsRunning);
    try {
      await this.gate('guest');
      if (this.failNextGuests > 0) {
        this.failNextGuests--;
        throw new VmError('agent_unresponsive', 'no hello (fake)', { operation: 'restore' });
      }
    } finally {
      this.guestsRunning--;
    }
    const m = new FakeMachine(this, state as FakeState);
    this.machines.push(m);
    return m;
  }

  /** Paused machines whose "files" exist. */
  readonly pausedOnDisk = new Map<string, FakePaused>();

  async resume(paused: PausedMachine): Promise<FakeMachine> {
    await this.gate('resume');
    this.fault('resume', null);
    const p = paused as FakePaused;
    if (this.failNextRestores > 0) {
      this.failNextRestores--;
      throw new VmError('start_failed', 'the VM failed to start (fake)', { operation: 'resume' });
    }
    const m = new FakeMachine(this, p.origin);
    for (const [k, v] of p.memory) m.memory.set(k, v);
    this.machines.push(m);
    await p.discard();
    return m;
  }

  /** Paused machines exported, by file path: what `readExported` serves to another fake. */
  readonly exported = new Map<string, Buffer>();
  /** Parts every import fetched (the other node's files it lacked). */
  readonly fetched: string[] = [];
  /** Template builds (image keys) this fake has: its own booted, and those copied. */
  readonly builds = new Set<string>();
  /** Builds an import copied from another node, in order. */
  readonly copiedBuilds: string[] = [];

  /** The build `state` runs on, as an export names it (one file standing for its files). */
  private exportBuild(state: FakeState): ExportedBuild {
    const path = `cache/templates/${state.template}/${state.build}/rootfs.erofs`;
    const body = Buffer.from(`the root filesystem of ${state.build}`);
    this.exported.set(path, body);
    const sha256 = createHash('sha256').update(body).digest('hex');
    return {
      template: state.template,
      key: state.build,
      files: [{ path, size: body.length, sha256 }],
    };
  }

  /**
   * Makes sure this fake has build `key`, fetching it as the real import does when it lacks it
   * (its own differs); refuses a state whose build it lacks and the export does not carry.
   */
  private async ensureBuild(
    key: string,
    build: ExportedBuild | undefined,
    fetch: FileFetcher,
  ): Promise<void> {
    if (this.builds.has(key)) return;
    if (!build || build.key !== key) {
      throw new VmError('state_corrupt', `made on template build ${key}, which is not here`);
    }
    for (const file of build.files) await this.fetchChecked(fetch, file);
    this.builds.add(key);
    this.copiedBuilds.push(key);
  }

  /** The state `id` of build `build` this fake has, or null (one of its own build differs). */
  private known(id: string, build: string): FakeState | null {
    const state = this.disk.get(id);
    return state && state.build === build ? state : null;
  }

  async exportPaused(paused: PausedMachine): Promise<PausedManifest> {
    const p = paused as FakePaused;
    const body = Buffer.from(
      JSON.stringify({
        memory: [...p.memory],
        origin: p.origin.id,
        originMemory: [...p.origin.memory],
        template: p.origin.template,
        build: p.origin.build,
      }),
    );
    const path = `paused/${p.id}/memory.delta`;
    this.exported.set(path, body);
    const sha256 = createHash('sha256').update(body).digest('hex');
    return {
      format: 1,
      paused: p.describe(),
      parts: [{ kind: 'paused', id: p.id, files: [{ path, size: body.length, sha256 }] }],
      build: this.exportBuild(p.origin),
    };
  }

  async readExported(path: string, offset: number): Promise<ExportedRead> {
    const body = this.exported.get(path);
    if (!body) throw new VmError('unsupported', `not an exported file: ${path}`);
    return { size: body.length, stream: Readable.from([body.subarray(offset)]) };
  }

  /** A part's file fetched whole and checked against its checksum, as the real imports do. */
  private async fetchChecked(fetch: FileFetcher, file: ExportedFile): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of await fetch(file, 0)) chunks.push(Buffer.from(c));
    const body = Buffer.concat(chunks);
    if (createHash('sha256').update(body).digest('hex') !== file.sha256) {
      throw new VmError('state_corrupt', `${file.path} arrived with another checksum`);
    }
    this.fetched.push(file.path);
    return body;
  }

  async importPaused(manifest: PausedManifest, fetch: FileFetcher): Promise<PausedMachine> {
    const part = manifest.parts.find((x) => x.kind === 'paused');
    const file = part?.files[0];
    if (!part || !file) throw new VmError('state_corrupt', 'no paused part');
    const body = await this.fetchChecked(fetch, file);
    const data = JSON.parse(body.toString('utf8')) as {
      memory: [string, string][];
      origin: string;
      originMemory: [string, string][];
      template: string;
      build: string;
    };
    // The build first, as the real import fetches it before any part.
    await this.ensureBuild(data.build, manifest.build, fetch);
    // An origin this fake has by id (of that build) is reused, as the real import reuses a
    // part it has; a new one is kept by id too (a snapshot of it handed over next finds it).
    let origin = this.known(data.origin, data.build);
    if (!origin) {
      origin = new FakeState(data.origin, new Map(data.originMemory), data.template, data.build);
      if (!this.disk.has(origin.id)) this.disk.set(origin.id, origin);
    }
    origin.retain();
    return new FakePaused(this, new Map(data.memory), origin, part.id);
  }

  async exportState(state: FrozenState): Promise<StateManifest> {
    const st = state as FakeState;
    const body = Buffer.from(
      JSON.stringify({ memory: [...st.memory], template: st.template, build: st.build }),
    );
    const path = `images/${st.id}.mem`;
    this.exported.set(path, body);
    const sha256 = createHash('sha256').update(body).digest('hex');
    return {
      format: 1,
      state: this.describeState(st),
      parts: [{ kind: 'state', id: st.id, files: [{ path, size: body.length, sha256 }] }],
      build: this.exportBuild(st),
    };
  }

  /** A state this fake has by id is reused, as the real import reuses a part it has. */
  async importState(manifest: StateManifest, fetch: FileFetcher): Promise<FrozenState> {
    const known = manifest.build && this.known(manifest.state.id, manifest.build.key);
    if (known) return known;
    const file = manifest.parts.find((x) => x.kind === 'state')?.files[0];
    if (!file) throw new VmError('state_corrupt', 'no state part');
    const body = await this.fetchChecked(fetch, file);
    const data = JSON.parse(body.toString('utf8')) as {
      memory: [string, string][];
      template: string;
      build: string;
    };
    await this.ensureBuild(data.build, manifest.build, fetch);
    const state = new FakeState(manifest.state.id, new Map(data.memory), data.template, data.build);
    this.disk.set(state.id, state);
    return state;
  }

  async openPaused(descriptor: PausedDescriptor): Promise<PausedMachine> {
    const p = this.pausedOnDisk.get(descriptor.id);
    if (!p) throw new VmError('state_corrupt', `no paused machine ${descriptor.id}`);
    return p;
  }

  /** Machines taken over by `adopt` since the last `sweep`. */
  private readonly adopted = new Set<string>();

  async adopt(descriptor: MachineDescriptor): Promise<FakeMachine> {
    this.fault('adopt', null);
    const m = this.machines.find((x) => x.id === descriptor.id && x.alive);
    if (!m) throw new VmError('died', `the VM ${descriptor.id} is not running any more`);
    m.takeOver();
    this.adopted.add(m.id);
    return m;
  }

  /** Stops every live machine not adopted: what a restart finds of the crashed run. */
  async sweep(): Promise<number> {
    const orphans = this.live.filter((m) => !this.adopted.has(m.id));
    for (const m of orphans) await m.destroy('swept');
    this.adopted.clear();
    return orphans.length;
  }

  async prepareForkTarget(base: FrozenState): Promise<ForkTarget> {
    const t = new FakeTarget(base);
    this.targets.push(t);
    return t;
  }

  forkTargetCostMib(): number {
    return 10;
  }

  stateSizeBytes(): number {
    return 10 * 1024 * 1024;
  }

  /** States made durable (`persistState`), by id, in order. */
  readonly persisted: string[] = [];

  async persistState(state: FrozenState): Promise<void> {
    await this.gate('persist');
    this.persisted.push(state.id);
  }

  /** States by id, as if they were on disk: what `openState` finds after a "restart". */
  readonly disk = new Map<string, FakeState>();

  describeState(state: FrozenState): StateDescriptor {
    this.disk.set(state.id, state as FakeState);
    return { format: 1, id: state.id, spec: null };
  }

  async openState(descriptor: StateDescriptor): Promise<FrozenState> {
    const state = this.disk.get(descriptor.id);
    if (!state) throw new VmError('state_corrupt', `no state ${descriptor.id}`);
    return state;
  }

  /** Fork targets made before each `collectGarbage`, which would have deleted their copies. */
  readonly targetsAtCollection: number[] = [];

  async collectGarbage(): Promise<number> {
    this.targetsAtCollection.push(this.targets.length);
    return 0;
  }

  private readonly faults = new Map<FaultStep, { error: unknown; dies: string | undefined }[]>();

  /**
   * The next `step` throws `error` (any value: a VmError as the port promises, or a raw Error
   * to check core's handling of a bug). With `dies`, its machine dies first with that reason:
   * a QEMU that will not run its guest again after a failed pause.
   */
  failNext(step: FaultStep, error: unknown, dies?: string): void {
    const list = this.faults.get(step) ?? [];
    list.push({ error, dies });
    this.faults.set(step, list);
  }

  /** Throws the fault injected into `step`, if any (killing `machine` first when it says so). */
  fault(step: FaultStep, machine: FakeMachine | null): void {
    const next = this.faults.get(step)?.shift();
    if (!next) return;
    if (next.dies !== undefined) machine?.die(next.dies);
    throw next.error;
  }

  /** Makes every later `step` wait until `release(step)`. */
  hold(step: Step): void {
    if (!this.held.has(step)) this.held.set(step, { waiters: [] });
  }

  /** Lets held `step`s go, and later ones pass. */
  release(step: Step): void {
    const h = this.held.get(step);
    this.held.delete(step);
    h?.waiters.forEach((w) => w());
  }

  /** How many `step`s wait for `release`. */
  waitingAt(step: Step): number {
    return this.held.get(step)?.waiters.length ?? 0;
  }

  async gate(step: Step): Promise<void> {
    const h = this.held.get(step);
    if (h) await new Promise<void>((r) => h.waiters.push(r));
  }

  /** Live (not destroyed) machines. */
  get live(): FakeMachine[] {
    return this.machines.filter((m) => m.alive);
  }
}
