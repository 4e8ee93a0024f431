/**
 * The processes of a sandbox and its directory watches (the machine's processes port,
 * vm/channels/proc-channel.ts): many at once, beside the exec queue and the file lane, waiting
 * behind neither. Each start, connect or watch is a run: an async iterable its consumer pulls at
 * its own pace, which becomes the stream's credit in the guest, so a slow client slows its own
 * process and nothing else.
 *
 * What happens to them when the machine does (docs/api.md, "Processes"):
 * - processes belong to the machine, not to a stream: a client that goes away (`detach`) leaves
 *   its process running, and `connect` finds it again;
 * - a fork child's machine is a copy of its parent's: it has the same processes, running, with
 *   no stream attached;
 * - pause writes them to disk with the machine and resume brings them back; the streams open
 *   at the pause end (`stream_interrupted`), as those of a merge's replaced machine and of a
 *   shutdown do; deletion ends them with the sandbox (`sandbox_not_found`);
 * - a running process does not keep a sandbox from idling: only requests and stream traffic do.
 * A paused sandbox is resumed by any process operation, as by every other operation.
 */
import type { Logger } from 'pino';
import { fail, HostdError } from '../errors.js';
import {
  ProcChannelError,
  ProcOpError,
  type GuestProcesses,
  type Machine,
  type ProcessEnd,
  type ProcessInfo,
  type ProcessOutputStream,
  type ProcessSelector,
  type ProcessSink,
  type ProcessSpec,
  type ProcStream,
  type WatchEvent,
  type WatchSink,
  type WatchSpec,
} from '../vm/machine.js';
import type { SandboxRegistry } from './registry.js';
import type { Sandbox } from './sandbox.js';

export type {
  ProcessEnd,
  ProcessInfo,
  ProcessSelector,
  ProcessSpec,
  WatchEvent,
  WatchSpec,
} from '../vm/machine.js';

/** One event of a process run. */
export type ProcessEvent =
  | { readonly type: ProcessOutputStream; readonly data: Buffer }
  | { readonly type: 'end'; readonly end: ProcessEnd };

/** Where a run's events come from, and what its failures mean. */
interface Source {
  readonly sandbox: Sandbox;
  readonly machine: Machine;
  readonly what: string;
}

/** What a failure is about: to name it in the registry error. */
interface Context {
  readonly user?: string;
  readonly cwd?: string;
  readonly selector?: ProcessSelector;
  /** A watch's directory. */
  readonly path?: string;
}

type Translate = (err: unknown) => HostdError;

/**
 * A stream of events from the guest that its consumer pulls: buffered until pulled, each
 * handed back to the guest as credit once pulled. `started` settles when the guest attached the
 * stream or refused it. Ends with a last event (a process's end) or an error; a watch ends only
 * by `detach` or an error.
 */
abstract class Run<E> implements AsyncIterable<E> {
  private readonly queue: { event: E; bytes: number }[] = [];
  private failure: HostdError | null = null;
  private over = false;
  private wake: (() => void) | null = null;
  /** Set once the guest's stream exists. */
  stream: ProcStream | null = null;
  readonly started: Promise<void>;
  private attached!: () => void;
  private refused!: (err: HostdError) => void;

  constructor(
    protected readonly source: Source,
    private readonly translate: Translate,
  ) {
    this.started = new Promise((resolve, reject) => {
      this.attached = resolve;
      this.refused = reject;
    });
    this.started.catch(() => undefined);
  }

  /** Stops listening: the guest's stream is dropped (its process runs on); iteration ends. */
  detach(): void {
    if (this.over) return;
    this.over = true;
    this.stream?.detach();
    this.queue.length = 0;
    this.wakeUp();
  }

  /** True once nothing more will come (ended, failed or detached). */
  get finished(): boolean {
    return this.over && this.queue.length === 0;
  }

  protected attach(): void {
    this.attached();
  }

  protected push(event: E, bytes: number): void {
    if (this.over) return;
    this.queue.push({ event, bytes });
    this.source.sandbox.touch();
    this.wakeUp();
  }

  /** The last event: nothing follows it. */
  protected finish(event: E): void {
    if (this.over) return;
    this.queue.push({ event, bytes: 0 });
    this.over = true;
    this.wakeUp();
  }

  /** The guest refused the stream, or it was lost: before the start, `started` rejects. */
  protected fail(err: unknown): void {
    const failure = this.translate(err);
    this.refused(failure);
    if (this.over) return;
    this.failure = failure;
    this.over = true;
    this.wakeUp();
  }

  private wakeUp(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<E> {
    for (;;) {
      const next = this.queue.shift();
      if (next) {
        if (next.bytes > 0) this.stream?.consumed(next.bytes);
        yield next.event;
        continue;
      }
      if (this.over) {
        if (this.failure) throw this.failure;
        return;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}

/** A process's output from the moment it was started or connected to, and its end. */
export class ProcessRun extends Run<ProcessEvent> {
  pid = 0;

  readonly sink: ProcessSink = {
    onStarted: (pid) => {
      this.pid = pid;
      this.attach();
    },
    onOutput: (stream, data, bytes) => this.push({ type: stream, data }, bytes),
    onEnd: (end) => this.finish({ type: 'end', end }),
    onError: (err) => this.fail(err),
    onLost: (reason) => this.fail(new ProcChannelError('closed', reason)),
  };
}

/** A directory's changes, in batches as the guest read them. */
export class WatchRun extends Run<WatchEvent[]> {
  /** The directory watched, as the guest resolved it. */
  path = '';

  readonly sink: WatchSink = {
    onStarted: (path) => {
      this.path = path;
      this.attach();
    },
    onEvents: (events, bytes) => this.push(events, bytes),
    onError: (err) => this.fail(err),
    onLost: (reason) => this.fail(new ProcChannelError('closed', reason)),
  };
}

export class SandboxProcesses {
  constructor(
    private readonly registry: SandboxRegistry,
    private readonly log: Logger,
  ) {}

  /** Starts a process; resolves once it runs (its pid known), with its output to come. */
  async start(id: string, spec: ProcessSpec, signal?: AbortSignal): Promise<ProcessRun> {
    const source = await this.source(id, signal, 'start the process');
    const run = new ProcessRun(source, (err) =>
      this.translate(err, source, { user: spec.user, cwd: spec.cwd }),
    );
    await this.open(run, source, (p) => p.start(spec, run.sink));
    return run;
  }

  /** Attaches to a running process's output from now on (a process that just ended: its end). */
  async connect(id: string, selector: ProcessSelector, signal?: AbortSignal): Promise<ProcessRun> {
    const source = await this.source(id, signal, 'connect to the process');
    const run = new ProcessRun(source, (err) => this.translate(err, source, { selector }));
    await this.open(run, source, (p) => p.connect(selector, run.sink));
    return run;
  }

  /** Watches a directory; events come until the run is detached. */
  async watch(id: string, spec: WatchSpec, signal?: AbortSignal): Promise<WatchRun> {
    const source = await this.source(id, signal, 'watch the directory');
    const run = new WatchRun(source, (err) =>
      this.translate(err, source, { user: spec.user, path: spec.path }),
    );
    await this.open(run, source, (p) => p.watch(spec, run.sink));
    return run;
  }

  /** The running processes. */
  list(id: string, signal?: AbortSignal): Promise<ProcessInfo[]> {
    return this.unary(id, signal, 'list the processes', (p) => p.list());
  }

  /** Writes to a process's stdin; resolves once the bytes are in its pipe. */
  sendInput(
    id: string,
    selector: ProcessSelector,
    data: Buffer,
    signal?: AbortSignal,
  ): Promise<void> {
    return this.unary(id, signal, 'write to the process', (p) => p.input(selector, data), selector);
  }

  closeStdin(id: string, selector: ProcessSelector, signal?: AbortSignal): Promise<void> {
    return this.unary(id, signal, 'close the stdin', (p) => p.closeStdin(selector), selector);
  }

  /** Sends a signal by number (9 ends everything the process started, guest/PROTOCOL.md). */
  signal(
    id: string,
    selector: ProcessSelector,
    signum: number,
    signal?: AbortSignal,
  ): Promise<void> {
    return this.unary(
      id,
      signal,
      'signal the process',
      (p) => p.signal(selector, signum),
      selector,
    );
  }

  // ---- internals ------------------------------------------------------------------------

  /** The sandbox's running machine (resuming a paused one first). */
  private async source(id: string, signal: AbortSignal | undefined, what: string): Promise<Source> {
    for (;;) {
      const sandbox = this.registry.get(id, true);
      if (sandbox.paused) {
        (await this.registry.acquire(id, signal)).release();
        continue;
      }
      if (!sandbox.isRunning()) throw fail('sandboxNotFound', id);
      sandbox.touch();
      return { sandbox, machine: sandbox.machine, what };
    }
  }

  private processesOf(source: Source): GuestProcesses {
    try {
      return source.machine.processes;
    } catch (err) {
      throw this.translate(err, source, {});
    }
  }

  private async open(
    run: ProcessRun | WatchRun,
    source: Source,
    begin: (p: GuestProcesses) => ProcStream,
  ): Promise<void> {
    run.stream = begin(this.processesOf(source));
    await run.started;
  }

  private async unary<T>(
    id: string,
    signal: AbortSignal | undefined,
    what: string,
    op: (p: GuestProcesses) => Promise<T>,
    selector?: ProcessSelector,
  ): Promise<T> {
    const source = await this.source(id, signal, what);
    try {
      return await op(this.processesOf(source));
    } catch (err) {
      throw this.translate(err, source, { selector });
    }
  }

  /** What the guest or the channel said, as a registry error. */
  private translate(err: unknown, source: Source, context: Context): HostdError {
    if (err instanceof HostdError) return err;
    const { sandbox } = source;
    const { selector } = context;
    if (err instanceof ProcOpError) {
      const path = context.path ?? '';
      switch (err.code) {
        case 'not_found':
          return fail('processNotFound', describe(selector));
        case 'unknown_user':
          return fail('unknownUser', context.user ?? '');
        case 'invalid_cwd':
          return fail('invalidCwd', err.path ?? context.cwd ?? '');
        case 'start_failed':
          this.log.info({ sandbox: sandbox.id, detail: err.detail }, 'a process could not start');
          return fail('processStartFailed');
        case 'stdin_closed':
          return fail('stdinClosed', describe(selector));
        case 'file_not_found':
          return fail('fileNotFound', path);
        case 'not_a_directory':
          return fail('notADirectory', path);
        case 'permission_denied':
          return fail('permissionDenied', path, err.detail);
        case 'invalid_path':
          return fail('invalidPath', path, err.detail);
        case 'invalid_argument':
        case 'bad_request':
          return fail('invalidProcessRequest', err.detail);
        default:
          return fail('vmOperationFailed', source.what, err.detail);
      }
    }
    if (err instanceof ProcChannelError && err.reason === 'unavailable') {
      return fail('processesUnavailable', sandbox.id);
    }
    if (!this.registry.holds(sandbox)) return fail('sandboxDeleted', sandbox.id);
    const why = err instanceof Error ? err.message : String(err);
    if (!source.machine.alive && sandbox.machine === source.machine) {
      this.log.warn({ err, sandbox: sandbox.id }, 'a process stream was lost with its VM');
    }
    return fail('streamInterrupted', why);
  }
}

function describe(selector: ProcessSelector | undefined): string {
  if (!selector) return 'that pid';
  return 'pid' in selector ? `pid ${selector.pid}` : `tag ${JSON.stringify(selector.tag)}`;
}
