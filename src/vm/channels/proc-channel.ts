/**
 * Host side of one VM's processes port, `hostd.proc` (guest/PROTOCOL.md, "Processes port"):
 * processes started, listed, signalled, fed input and reconnected to, and directories watched,
 * many at once, each stream multiplexed on the port by a frame id this end picks.
 *
 * Streams (a process's output, a directory's events) have a credit: the guest sends a stream at
 * most WINDOW bytes its consumer has not taken yet, and `consumed()` gives them back, so one slow
 * client holds up its own process and nothing else. Requests (list, input, signal) are answered
 * on their own ids.
 *
 * Resynchronisation: as the files port, the first request after connecting (or after the guest
 * sent something impossible) is preceded by a hello in the same write; what the guest sent
 * before its answer is discarded. A hello voids the guest's streams of the old connection.
 */
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import {
  FrameParser,
  type FrameSink,
  Kind,
  MAX_TO_GUEST_PAYLOAD,
  HelloHandshake,
  encodeFrame,
  jsonFrame,
  parseJsonObject,
} from './port-frames.js';
import { type DetailedEntry, toDetailedEntry } from './user-files.js';

export { PROC_PORT_NAME } from './port-names.js';

const PROTOCOL_VERSION = 1;
/** Bytes of a stream the guest may send ahead of its consumer (proc_server.WINDOW). */
export const WINDOW = 256 * 1024;
/** Credit goes back in batches of at least this much (or all of it when the consumer caught up). */
const CREDIT_BATCH = WINDOW / 4;

const LIMITS = {
  kinds: new Set<number>([Kind.json, Kind.data]),
  maxData: 32 * 1024 + 1,
  maxControl: 32 * 1024 * 1024, // a listing of many processes with large environments
  wholeData: true,
};

/** Codes the guest answers a failed request or stream with (guest/PROTOCOL.md). */
export type ProcErrorCode =
  | 'not_found'
  | 'unknown_user'
  | 'invalid_cwd'
  | 'start_failed'
  | 'invalid_argument'
  | 'stdin_closed'
  | 'file_not_found'
  | 'not_a_directory'
  | 'permission_denied'
  | 'invalid_path'
  | 'io_error'
  | 'bad_request';

const PROC_ERROR_CODES: ReadonlySet<string> = new Set<ProcErrorCode>([
  'not_found',
  'unknown_user',
  'invalid_cwd',
  'start_failed',
  'invalid_argument',
  'stdin_closed',
  'file_not_found',
  'not_a_directory',
  'permission_denied',
  'invalid_path',
  'io_error',
  'bad_request',
]);

/** The guest refused or failed a request: core maps `code` to its error registry. */
export class ProcOpError extends Error {
  constructor(
    readonly code: ProcErrorCode,
    readonly detail: string,
    /** invalid_cwd: the resolved directory. */
    readonly path?: string,
  ) {
    super(`${code}: ${detail}`);
    this.name = 'ProcOpError';
  }
}

/** The request or stream ended for a reason that is not the guest's answer. */
export class ProcChannelError extends Error {
  constructor(
    /** `unavailable`: the machine has no processes port (its state predates it). */
    readonly reason: 'closed' | 'timeout' | 'protocol' | 'unavailable',
    message: string,
  ) {
    super(message);
    this.name = 'ProcChannelError';
  }
}

/** A process to start (guest/PROTOCOL.md, `start`). */
export interface ProcessSpec {
  readonly cmd: string;
  readonly args: readonly string[];
  readonly envs: Readonly<Record<string, string>>;
  /** Resolved as the user's path; default the user's home. */
  readonly cwd?: string;
  /** A guest account; default root. */
  readonly user?: string;
  /** A stdin pipe for `input` and `closeStdin` (else stdin is /dev/null). */
  readonly stdin: boolean;
  /** Lifetime in ms; past it the guest kills the process. 0: none. */
  readonly timeoutMs: number;
  readonly tag?: string;
}

/** Names a running process. */
export type ProcessSelector = { readonly pid: number } | { readonly tag: string };

/** A running process, as `list` shows it. */
export interface ProcessInfo {
  pid: number;
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd: string;
  user: string;
  tag?: string;
}

/** How a process ended. */
export interface ProcessEnd {
  /** Its exit status; null when a signal killed it. */
  exitCode: number | null;
  signal: number | null;
  /** Killed because its lifetime (`timeoutMs`) ran out. */
  timedOut: boolean;
}

export type ProcessOutputStream = 'stdout' | 'stderr';

/** Receives one process stream. Exactly one of onEnd, onError, onLost is called, last. */
export interface ProcessSink {
  /** First, once: the stream is attached (its process runs, or ended just now: onEnd follows). */
  onStarted(pid: number): void;
  /** `bytes` is what to hand back to `consumed()` once the data is taken. */
  onOutput(stream: ProcessOutputStream, data: Buffer, bytes: number): void;
  onEnd(end: ProcessEnd): void;
  /** The guest refused the stream (before onStarted). */
  onError(err: ProcOpError): void;
  /** The channel closed or started over: the process may still run. */
  onLost(reason: string): void;
}

/** A directory to watch (guest/PROTOCOL.md, `watch`). */
export interface WatchSpec {
  readonly path: string;
  /** Resolve `path` as this user's (else it must be absolute). */
  readonly user?: string;
  readonly recursive: boolean;
  /** Attach the entry to create, write and chmod events. */
  readonly entries: boolean;
}

export type WatchEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod';

export interface WatchEvent {
  /** Relative to the watched directory. */
  name: string;
  type: WatchEventType;
  /** The entry, when asked for and the guest could still read it. */
  entry?: DetailedEntry;
}

/** Receives one watch. Exactly one of onError, onLost is called, last (a watch never ends). */
export interface WatchSink {
  onStarted(path: string): void;
  onEvents(events: WatchEvent[], bytes: number): void;
  onError(err: ProcOpError): void;
  onLost(reason: string): void;
}

/** An open stream: hand back what was consumed, or detach (the process runs on). */
export interface ProcStream {
  consumed(bytes: number): void;
  detach(): void;
}

interface StreamState {
  readonly kind: 'process' | 'watch';
  readonly process?: ProcessSink;
  readonly watch?: WatchSink;
  started: boolean;
  /** Consumed bytes not yet given back as credit. */
  unacked: number;
  /** Bytes received and not consumed yet. */
  inFlight: number;
}

interface Pending {
  resolve(msg: Record<string, unknown>): void;
  reject(err: Error): void;
}

const WATCH_TYPES: ReadonlySet<string> = new Set(['create', 'write', 'remove', 'rename', 'chmod']);

/**
 * One VM's processes port. Emits `close` (with the reason) once, when the socket closed: every
 * stream is lost and every request fails with ProcChannelError 'closed'.
 */
export class ProcChannel extends EventEmitter {
  private readonly parser: FrameParser;
  private readonly hello: HelloHandshake;
  private nextId = 1;
  private closedReason: string | null = null;
  private readonly streams = new Map<number, StreamState>();
  private readonly pending = new Map<number, Pending>();
  private readonly helloTimeoutMs: number;

  /** Takes over a connected socket: QEMU's unix-socket chardev for the port. */
  constructor(
    private readonly socket: Socket,
    options: { helloTimeoutMs?: number } = {},
  ) {
    super();
    this.helloTimeoutMs = options.helloTimeoutMs ?? 10_000;
    this.parser = new FrameParser(this.frameSink(), LIMITS);
    this.hello = new HelloHandshake(this.parser, PROTOCOL_VERSION, this.helloTimeoutMs, () =>
      this.syncTimedOut(),
    );
    socket.on('data', (chunk: Buffer) => this.parser.push(chunk));
    socket.on('error', () => undefined);
    socket.on('close', () => this.onClose('the processes channel closed'));
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /** Streams open now (tests, metrics). */
  get openStreams(): number {
    return this.streams.size;
  }

  /** Starts a process and streams its output to `sink`. */
  start(spec: ProcessSpec, sink: ProcessSink): ProcStream {
    const msg: Record<string, unknown> = {
      op: 'start',
      cmd: spec.cmd,
      args: spec.args,
      envs: spec.envs,
      stdin: spec.stdin,
      timeout_ms: spec.timeoutMs,
    };
    if (spec.cwd !== undefined) msg.cwd = spec.cwd;
    if (spec.user !== undefined) msg.user = spec.user;
    if (spec.tag !== undefined) msg.tag = spec.tag;
    return this.openStream({ kind: 'process', process: sink }, msg);
  }

  /** Streams the output of a running process from now on (or the end of one that just ended). */
  connect(selector: ProcessSelector, sink: ProcessSink): ProcStream {
    return this.openStream({ kind: 'process', process: sink }, { op: 'connect', ...selector });
  }

  /** Streams the changes under a directory. */
  watch(spec: WatchSpec, sink: WatchSink): ProcStream {
    const msg: Record<string, unknown> = {
      op: 'watch',
      path: spec.path,
      recursive: spec.recursive,
      entries: spec.entries,
    };
    if (spec.user !== undefined) msg.user = spec.user;
    return this.openStream({ kind: 'watch', watch: sink }, msg);
  }

  /** The running processes, by pid. */
  async list(): Promise<ProcessInfo[]> {
    const answer = await this.request({ op: 'list' });
    const list = Array.isArray(answer.processes) ? answer.processes.map(toProcessInfo) : null;
    if (!list || list.some((p) => p === null)) throw this.malformed('list');
    return list as ProcessInfo[];
  }

  /** Writes `data` to the process's stdin; resolves once it is in the pipe. */
  async input(selector: ProcessSelector, data: Buffer): Promise<void> {
    const frames: Buffer[] = [];
    for (let off = 0; off < data.length; off += MAX_TO_GUEST_PAYLOAD) {
      frames.push(encodeFrame(Kind.data, 0, data.subarray(off, off + MAX_TO_GUEST_PAYLOAD)));
    }
    frames.push(encodeFrame(Kind.end, 0));
    await this.request({ op: 'input', ...selector }, frames);
  }

  /** Closes the process's stdin once what was written before is in the pipe. */
  async closeStdin(selector: ProcessSelector): Promise<void> {
    await this.request({ op: 'close_stdin', ...selector });
  }

  /** Sends a signal (a number: 9 kills everything the process started, guest/PROTOCOL.md). */
  async signal(selector: ProcessSelector, signal: number): Promise<void> {
    await this.request({ op: 'signal', ...selector, signal });
  }

  close(reason = 'the processes channel was closed by hostd'): void {
    this.onClose(reason);
    this.socket.destroy();
  }

  // ---- requests and streams -------------------------------------------------------------

  private newId(): number {
    const id = this.nextId;
    this.nextId = id >= 0xffffffff ? 1 : id + 1; // 0 is the hello's
    return id;
  }

  /**
   * Sends a request and resolves with its `ok` (or `list`) answer. `tail` are frames that
   * follow the request (an input's data and end), written with their id set.
   */
  private request(
    msg: Record<string, unknown>,
    tail: Buffer[] = [],
  ): Promise<Record<string, unknown>> {
    if (this.closedReason) {
      return Promise.reject(new ProcChannelError('closed', this.closedReason));
    }
    const id = this.newId();
    for (const frame of tail) frame.writeUInt32BE(id, 1);
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.send([...this.hello.requestFrames(id, msg), ...tail]);
    });
  }

  private openStream(
    state: Pick<StreamState, 'kind' | 'process' | 'watch'>,
    msg: Record<string, unknown>,
  ): ProcStream {
    const id = this.newId();
    const stream: StreamState = { ...state, started: false, unacked: 0, inFlight: 0 };
    const handle: ProcStream = {
      consumed: (bytes) => this.consumed(id, stream, bytes),
      detach: () => this.detach(id, stream),
    };
    if (this.closedReason) {
      const reason = this.closedReason;
      queueMicrotask(() => lost(stream, reason));
      return handle;
    }
    this.streams.set(id, stream);
    this.send(this.hello.requestFrames(id, msg));
    return handle;
  }

  private consumed(id: number, stream: StreamState, bytes: number): void {
    if (this.streams.get(id) !== stream) return;
    stream.inFlight -= bytes;
    stream.unacked += bytes;
    if (stream.unacked >= CREDIT_BATCH || (stream.inFlight <= 0 && stream.unacked > 0)) {
      const credit = Buffer.alloc(4);
      credit.writeUInt32BE(stream.unacked, 0);
      stream.unacked = 0;
      this.send([encodeFrame(Kind.credit, id, credit)]);
    }
  }

  private detach(id: number, stream: StreamState): void {
    if (this.streams.get(id) !== stream) return;
    this.streams.delete(id);
    if (this.hello.started) this.send([jsonFrame(id, { op: 'detach' })]);
  }

  private send(buffers: Buffer[]): void {
    if (this.closedReason) return;
    this.socket.cork();
    for (const buffer of buffers) this.socket.write(buffer);
    this.socket.uncork();
  }

  /** Everything open fails with `err`; the next request starts over with a hello. */
  private startOver(err: ProcChannelError): void {
    this.hello.reset();
    const streams = [...this.streams.values()];
    const pending = [...this.pending.values()];
    this.streams.clear();
    this.pending.clear();
    for (const stream of streams) lost(stream, err.message);
    for (const p of pending) p.reject(err);
  }

  private syncTimedOut(): void {
    const ms = this.helloTimeoutMs;
    this.startOver(
      new ProcChannelError(
        'timeout',
        `the guest's processes server did not answer within ${ms} ms`,
      ),
    );
  }

  private protocolError(reason: string): void {
    this.startOver(new ProcChannelError('protocol', `the guest's processes server sent ${reason}`));
  }

  private malformed(what: string): ProcChannelError {
    return new ProcChannelError(
      'protocol',
      `the guest's processes server sent a malformed ${what}`,
    );
  }

  private onClose(reason: string): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.startOver(new ProcChannelError('closed', reason));
    this.emit('close', reason);
  }

  // ---- what the guest sends -------------------------------------------------------------

  private frameSink(): FrameSink {
    return {
      synced: () => this.hello.answered(),
      frame: (kind, id, payload) => {
        if (kind === Kind.data) return this.onData(id, payload);
        const msg = parseJsonObject(payload);
        if (!msg) return this.protocolError('a malformed frame');
        const stream = this.streams.get(id);
        if (stream) return this.onStreamMessage(id, stream, msg, payload.length);
        const pending = this.pending.get(id);
        if (!pending) return; // of a stream detached meanwhile
        this.pending.delete(id);
        if (msg.op === 'error') pending.reject(toOpError(msg));
        else if (msg.op === 'ok' || msg.op === 'list') pending.resolve(msg);
        else pending.reject(this.malformed('answer'));
      },
      data: () => undefined, // wholeData: every data frame comes through frame()
      broken: (reason) => this.protocolError(reason),
    };
  }

  private onData(id: number, payload: Buffer): void {
    const stream = this.streams.get(id);
    if (!stream) return; // detached meanwhile: the guest stops once it reads the detach
    const marker = payload[0];
    if (stream.kind !== 'process' || !stream.started || (marker !== 1 && marker !== 2)) {
      return this.protocolError('output on a stream that cannot have any');
    }
    stream.inFlight += payload.length;
    stream.process!.onOutput(
      marker === 1 ? 'stdout' : 'stderr',
      payload.subarray(1),
      payload.length,
    );
  }

  private onStreamMessage(
    id: number,
    stream: StreamState,
    msg: Record<string, unknown>,
    bytes: number,
  ): void {
    if (msg.op === 'error') {
      this.streams.delete(id);
      const err = toOpError(msg);
      if (stream.process) stream.process.onError(err);
      else stream.watch!.onError(err);
      return;
    }
    if (msg.op === 'started' && !stream.started) {
      stream.started = true;
      if (stream.process) {
        if (!isCount(msg.pid)) return this.protocolError('a malformed start');
        stream.process.onStarted(msg.pid);
      } else {
        stream.watch!.onStarted(typeof msg.path === 'string' ? msg.path : '');
      }
      return;
    }
    if (msg.op === 'end' && stream.process && stream.started) {
      this.streams.delete(id);
      stream.process.onEnd({
        exitCode: Number.isSafeInteger(msg.exit_code) ? (msg.exit_code as number) : null,
        signal: Number.isSafeInteger(msg.signal) ? (msg.signal as number) : null,
        timedOut: msg.timed_out === true,
      });
      return;
    }
    if (msg.op === 'events' && stream.watch && stream.started && Array.isArray(msg.events)) {
      const events = msg.events.map(toWatchEvent);
      if (events.some((e) => e === null)) return this.protocolError('a malformed event');
      stream.inFlight += bytes;
      stream.watch.onEvents(events as WatchEvent[], bytes);
      return;
    }
    this.protocolError(`an unexpected ${String(msg.op)} message`);
  }
}

function lost(stream: StreamState, reason: string): void {
  if (stream.process) stream.process.onLost(reason);
  else stream.watch!.onLost(reason);
}

function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

function toOpError(msg: Record<string, unknown>): ProcOpError {
  const code =
    typeof msg.code === 'string' && PROC_ERROR_CODES.has(msg.code) ? msg.code : 'io_error';
  const message = typeof msg.message === 'string' ? msg.message : 'the guest gave no reason';
  const path = typeof msg.path === 'string' ? msg.path.slice(0, 4096) : undefined;
  return new ProcOpError(code as ProcErrorCode, message.slice(0, 2000), path);
}

function isStringMap(v: unknown): v is Record<string, string> {
  return (
    typeof v === 'object' &&
    v !== null &&
    !Array.isArray(v) &&
    Object.values(v).every((x) => typeof x === 'string')
  );
}

function toProcessInfo(v: unknown): ProcessInfo | null {
  if (typeof v !== 'object' || v === null) return null;
  const p = v as Record<string, unknown>;
  if (
    !isCount(p.pid) ||
    typeof p.cmd !== 'string' ||
    !Array.isArray(p.args) ||
    !p.args.every((a) => typeof a === 'string') ||
    !isStringMap(p.envs) ||
    typeof p.cwd !== 'string' ||
    typeof p.user !== 'string'
  ) {
    return null;
  }
  const info: ProcessInfo = {
    pid: p.pid,
    cmd: p.cmd,
    args: p.args as string[],
    envs: p.envs,
    cwd: p.cwd,
    user: p.user,
  };
  if (typeof p.tag === 'string') info.tag = p.tag;
  return info;
}

function toWatchEvent(v: unknown): WatchEvent | null {
  if (typeof v !== 'object' || v === null) return null;
  const e = v as Record<string, unknown>;
  if (typeof e.name !== 'string' || typeof e.type !== 'string' || !WATCH_TYPES.has(e.type)) {
    return null;
  }
  const event: WatchEvent = { name: e.name, type: e.type as WatchEventType };
  if (e.entry !== undefined) {
    const entry = toDetailedEntry(e.entry);
    if (!entry) return null;
    event.entry = entry;
  }
  return event;
}
