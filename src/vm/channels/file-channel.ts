/**
 * Host side of one VM's files port, `hostd.files` (guest/PROTOCOL.md, "Files port"): reads and
 * writes guest files as streams, lists, stats, makes and removes them, moves directories as
 * tar streams. The guest serves it from a thread of its agent, so it works while an exec runs.
 *
 * One operation at a time: hostd queues file operations per sandbox (their own lane, next to
 * the exec queue) and starts the next when the previous one's promise settled; starting one
 * while another runs fails with FileChannelError 'busy'. Every promise (and an upload's
 * `done`, a download's `done`) settles only once the channel is free again.
 *
 * Resynchronisation: the first operation after connect() or resync() (call it after every
 * restore of the VM from a snapshot) is preceded by a hello in the same write; everything the
 * guest sent before its answer is discarded, and the guest drops whatever it was doing.
 */
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import type { Readable, Writable } from 'node:stream';
import {
  DownloadOp,
  type ExtractResult,
  type FileEntry,
  FileChannelError,
  type FileOp,
  type OpLink,
  RequestOp,
  UploadOp,
  type WriteResult,
  toEntries,
  toEntry,
  toExtractResult,
  toWriteResult,
} from './file-transfers.js';
import {
  FrameParser,
  type FrameSink,
  Kind,
  HelloHandshake,
  jsonFrame,
  parseJsonObject,
} from './port-frames.js';
import {
  type DetailedEntry,
  type MkdirResult,
  type MoveResult,
  type UserWriteResult,
  toDetailedEntries,
  toDetailedEntry,
  toMkdirResult,
  toMoveResult,
  toUserWriteResult,
} from './user-files.js';

export type { DetailedEntry, MkdirResult, MoveResult, UserWriteResult } from './user-files.js';
export {
  type ExtractResult,
  type FileEntry,
  type FileErrorCode,
  FileChannelError,
  type FileChannelFailure,
  FileOpError,
  type WriteResult,
} from './file-transfers.js';

export { FILES_PORT_NAME } from './port-names.js';
const PROTOCOL_VERSION = 1;

export interface FileChannelOptions {
  /** How long the guest may take to answer a hello. Default 10 s (a busy guest under TCG). */
  readonly helloTimeoutMs?: number;
  /**
   * How long a cancelled operation may take to end in the guest before the channel stops
   * waiting for it (and resynchronises before the next one). Default 5 s.
   */
  readonly cancelTimeoutMs?: number;
}

export interface OpOptions {
  /** Aborting cancels the operation in the guest; its promise then rejects 'cancelled'. */
  readonly signal?: AbortSignal;
}

/** A running upload: pipe the body into `sink`; `done` has the guest's answer. */
export interface Upload<R> {
  readonly sink: Writable;
  readonly done: Promise<R>;
}

/** A running download: `stream` carries the bytes (`size` of them, unless null). */
export interface Download {
  readonly size: number | null;
  readonly stream: Readable;
  /** Settles once the guest said the transfer is complete (or failed: `stream` errors too). */
  readonly done: Promise<void>;
}

const LIMITS = {
  kinds: new Set<number>([Kind.json, Kind.data]),
  maxData: 1024 * 1024,
  maxControl: 32 * 1024 * 1024, // a listing of a large directory
};

/**
 * One VM's files port. Emits `close` (with the reason) once, when the socket closed: the VM
 * is gone, and every operation fails with FileChannelError 'closed'.
 */
export class FileChannel extends EventEmitter {
  private readonly parser: FrameParser;
  private readonly hello: HelloHandshake;
  private cancelTimer: NodeJS.Timeout | null = null;
  private op: FileOp | null = null;
  private nextId = 1;
  private closedReason: string | null = null;
  private drainWaiters: ((err?: Error) => void)[] = [];
  private readonly helloTimeoutMs: number;
  private readonly cancelTimeoutMs: number;

  /**
   * Takes over a connected socket: QEMU's unix-socket chardev for the port, connected when the
   * VM starts, as the agent's (so the guest never sees the port without a host).
   */
  constructor(
    private readonly socket: Socket,
    options: FileChannelOptions = {},
  ) {
    super();
    this.helloTimeoutMs = options.helloTimeoutMs ?? 10_000;
    this.cancelTimeoutMs = options.cancelTimeoutMs ?? 5_000;
    this.parser = new FrameParser(this.frameSink(), LIMITS);
    this.hello = new HelloHandshake(this.parser, PROTOCOL_VERSION, this.helloTimeoutMs, () =>
      this.syncTimedOut(),
    );
    socket.on('data', (chunk: Buffer) => this.parser.push(chunk));
    socket.on('drain', () => this.drained());
    socket.on('error', () => undefined);
    socket.on('close', () => this.onClose('the files channel closed'));
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /** Whether an operation runs (the next must wait until its promise settled). */
  get busy(): boolean {
    return this.op !== null;
  }

  /** The guest's state is unknown (the VM was restored): the next operation says hello first. */
  resync(): void {
    this.hello.reset();
  }

  /** Writes file `path` from what is written into the sink (created, or replaced, whole). */
  writeFile(path: string, options: OpOptions & { mode?: number } = {}): Upload<WriteResult> {
    const op = this.beginWrite(path, options);
    return { sink: op.sink, done: op.promise };
  }

  /** writeFile for content already in memory: request, data and end leave in one write. */
  putFile(
    path: string,
    content: Buffer,
    options: OpOptions & { mode?: number } = {},
  ): Promise<WriteResult> {
    const op = this.beginWrite(path, options);
    if (this.op === op) op.sendWhole(content);
    return op.promise;
  }

  private beginWrite(path: string, options: OpOptions & { mode?: number }): UploadOp<WriteResult> {
    const request = { op: 'write', path, mode: options.mode ?? 0o644 };
    const op = new UploadOp(this.newId(), path, this.link, request, toWriteResult);
    return this.begin(op, options.signal);
  }

  /** Reads file `path` (symbolic links followed); resolves once its size is known. */
  async readFile(path: string, options: OpOptions = {}): Promise<Download> {
    const op = this.begin(new DownloadOp(this.newId(), path, this.link, true), options.signal, {
      op: 'read',
      path,
    });
    const size = await op.announced;
    return { size, stream: op.stream, done: op.done };
  }

  /** Directory (or file) `path` as a tar stream, names relative to it. */
  async tarOut(path: string, options: OpOptions = {}): Promise<Download> {
    const op = this.begin(new DownloadOp(this.newId(), path, this.link, false), options.signal, {
      op: 'tar_out',
      path,
    });
    await op.announced;
    return { size: null, stream: op.stream, done: op.done };
  }

  /** Extracts the tar stream written into the sink into directory `path` (created). */
  tarIn(path: string, options: OpOptions = {}): Upload<ExtractResult> {
    const op = this.begin(
      new UploadOp(this.newId(), path, this.link, { op: 'tar_in', path }, toExtractResult),
      options.signal,
    );
    return { sink: op.sink, done: op.promise };
  }

  /** The entries of directory `path`, one level, sorted by name. */
  list(path: string, options: OpOptions = {}): Promise<FileEntry[]> {
    return this.request(path, { op: 'list', path }, toEntries, options);
  }

  /** `path` itself (a symbolic link is not followed). */
  stat(path: string, options: OpOptions = {}): Promise<FileEntry> {
    return this.request(path, { op: 'stat', path }, (done) => toEntry(done.entry), options);
  }

  /** mkdir -p. Resolves with the normalised path. */
  async mkdir(path: string, options: OpOptions = {}): Promise<string> {
    const done = await this.request(path, { op: 'mkdir', path }, pathOf, options);
    return done;
  }

  /** Removes a file or symbolic link; a directory only when `recursive`. */
  async remove(path: string, options: OpOptions & { recursive?: boolean } = {}): Promise<void> {
    const request = { op: 'remove', path, recursive: options.recursive === true };
    await this.request(path, request, () => true, options);
  }

  /** Renames `source` to `destination`, making its missing parents (as `user`, when given). */
  move(
    source: string,
    destination: string,
    options: OpOptions & { user?: string } = {},
  ): Promise<MoveResult> {
    const msg: Record<string, unknown> = { op: 'move', source, destination };
    if (options.user !== undefined) msg.user = options.user;
    return this.request(source, msg, toMoveResult, options);
  }

  // ---- as a user (guest/PROTOCOL.md, "As a user": relative paths, ownership, E2B's ways) ---

  /** Writes `path` in place as `user`, replacing its metadata with `metadata`. */
  writeFileAs(
    user: string,
    path: string,
    options: OpOptions & { mode?: number; metadata?: Readonly<Record<string, string>> } = {},
  ): Upload<UserWriteResult> {
    const request: Record<string, unknown> = { op: 'write', path, user };
    if (options.mode !== undefined) request.mode = options.mode;
    if (options.metadata !== undefined) request.metadata = options.metadata;
    const op = this.begin(
      new UploadOp(this.newId(), path, this.link, request, toUserWriteResult),
      options.signal,
    );
    return { sink: op.sink, done: op.promise };
  }

  /** Reads `path` resolved for `user`. */
  async readFileAs(user: string, path: string, options: OpOptions = {}): Promise<Download> {
    const op = this.begin(new DownloadOp(this.newId(), path, this.link, true), options.signal, {
      op: 'read',
      path,
      user,
    });
    const size = await op.announced;
    return { size, stream: op.stream, done: op.done };
  }

  statAs(user: string, path: string, options: OpOptions = {}): Promise<DetailedEntry> {
    const msg = { op: 'stat', path, user };
    return this.request(path, msg, (done) => toDetailedEntry(done.entry), options);
  }

  /** The entries `depth` levels below `path` (pre-order, sorted by name at each level). */
  listAs(
    user: string,
    path: string,
    depth: number,
    options: OpOptions = {},
  ): Promise<DetailedEntry[]> {
    return this.request(path, { op: 'list', path, user, depth }, toDetailedEntries, options);
  }

  mkdirAs(user: string, path: string, options: OpOptions = {}): Promise<MkdirResult> {
    return this.request(path, { op: 'mkdir', path, user }, toMkdirResult, options);
  }

  /** rm -rf; resolves false when there was nothing to remove. */
  removeAs(user: string, path: string, options: OpOptions = {}): Promise<boolean> {
    return this.request(
      path,
      { op: 'remove', path, user },
      (done) => (typeof done.removed === 'boolean' ? done.removed : null),
      options,
    );
  }

  close(reason = 'the files channel was closed by hostd'): void {
    this.onClose(reason);
    this.socket.destroy();
  }

  // ---- running operations ---------------------------------------------------------------

  private request<T>(
    path: string,
    msg: Record<string, unknown>,
    parse: (done: Record<string, unknown>) => T | null,
    options: OpOptions,
  ): Promise<T> {
    return this.begin(new RequestOp(this.newId(), path, this.link, parse), options.signal, msg)
      .promise;
  }

  private newId(): number {
    const id = this.nextId;
    this.nextId = id >= 0xffffffff ? 1 : id + 1; // 0 is the hello's
    return id;
  }

  /** Makes `op` the running operation (sending `msg` as its request) or fails it at once. */
  private begin<T extends FileOp>(op: T, signal?: AbortSignal, msg?: Record<string, unknown>): T {
    const refusal = this.closedReason
      ? new FileChannelError('closed', this.closedReason)
      : this.op
        ? new FileChannelError('busy', 'another file operation is running on this channel')
        : signal?.aborted
          ? new FileChannelError('cancelled', `the operation on ${op.path} was cancelled`)
          : null;
    if (refusal) {
      op.finish(refusal, null);
      return op;
    }
    this.op = op;
    if (signal) {
      const onAbort = (): void => op.abort(new FileChannelError('cancelled', 'aborted'));
      signal.addEventListener('abort', onAbort, { once: true });
      op.onFinish = () => signal.removeEventListener('abort', onAbort);
    }
    if (msg) this.send(this.hello.requestFrames(op.id, msg));
    return op;
  }

  private send(buffers: Buffer[]): boolean {
    if (this.closedReason) return true;
    this.socket.cork();
    for (const buffer of buffers) this.socket.write(buffer);
    this.socket.uncork();
    return !this.socket.writableNeedDrain;
  }

  private cancel(op: FileOp): void {
    if (this.op !== op || op.finished || op.cancelSent) return;
    op.cancelSent = true;
    if (!op.started) {
      this.finishOp(
        op,
        new FileChannelError('cancelled', `the operation on ${op.path} was cancelled`),
      );
      return;
    }
    this.send([jsonFrame(op.id, { op: 'cancel' })]);
    // What the guest still sends is read and dropped until its done: it looks for the cancel
    // before every 256 KiB it writes, not only when a write blocks (guest/PROTOCOL.md).
    this.socket.resume();
    this.cancelTimer = setTimeout(() => {
      this.resync();
      this.finishOp(
        op,
        new FileChannelError('timeout', 'the guest did not end a cancelled operation'),
      );
    }, this.cancelTimeoutMs);
  }

  private finishOp(
    op: FileOp,
    err: Error | null,
    done: Record<string, unknown> | null = null,
  ): void {
    if (this.op === op) {
      this.op = null;
      if (this.cancelTimer) clearTimeout(this.cancelTimer);
      this.cancelTimer = null;
      if (!this.closedReason) this.socket.resume();
    }
    op.finish(err, done);
  }

  private protocolError(reason: string): void {
    this.resync(); // the next operation starts with a hello
    if (this.op) {
      this.finishOp(
        this.op,
        new FileChannelError('protocol', `the guest's files server sent ${reason}`),
      );
    }
  }

  private syncTimedOut(): void {
    if (this.op) {
      const ms = this.helloTimeoutMs;
      this.finishOp(
        this.op,
        new FileChannelError('timeout', `the guest's files server did not answer within ${ms} ms`),
      );
    }
  }

  private drained(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const waiter of waiters) waiter();
  }

  private onClose(reason: string): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.hello.reset();
    if (this.op) this.finishOp(this.op, new FileChannelError('closed', reason));
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const waiter of waiters) waiter(new FileChannelError('closed', reason));
    this.emit('close', reason);
  }

  /** What operations may ask of the channel. */
  private readonly link: OpLink = {
    send: (buffers) => this.send(buffers),
    whenDrained: (cb) => {
      if (this.closedReason) cb(new FileChannelError('closed', this.closedReason));
      else this.drainWaiters.push(cb);
    },
    pauseInput: () => this.socket.pause(),
    resumeInput: () => {
      if (!this.closedReason) this.socket.resume();
    },
    request: (id, msg) => this.hello.requestFrames(id, msg),
    coalesce: () => {
      if (this.closedReason) return;
      this.socket.cork();
      setImmediate(() => this.socket.uncork());
    },
    cancel: (op) => this.cancel(op),
    protocolError: (reason) => this.protocolError(reason),
  };

  private frameSink(): FrameSink {
    return {
      synced: () => this.hello.answered(),
      frame: (kind, id, payload) => {
        const op = this.op;
        if (kind !== Kind.json || op === null || op.id !== id) return; // stale: an op that ended
        const msg = parseJsonObject(payload);
        if (msg?.op === 'head') op.head(msg);
        else if (msg?.op === 'done') this.finishOp(op, null, msg);
        else this.protocolError('a malformed frame');
      },
      data: (id, piece) => {
        if (this.op !== null && this.op.id === id) this.op.data(piece);
      },
      broken: (reason) => this.protocolError(reason),
    };
  }
}

function pathOf(done: Record<string, unknown>): string | null {
  return typeof done.path === 'string' ? done.path : null;
}
