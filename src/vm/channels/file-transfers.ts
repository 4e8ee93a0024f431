/**
 * One operation of the files port as the host runs it (guest/PROTOCOL.md, "Files port"): a
 * request and its `done`, with an upload's Writable or a download's Readable in between.
 * file-channel.ts owns the port and runs one of these at a time; these never touch the socket
 * themselves but through OpLink. What the guest sends is validated here: a guest that sends
 * something impossible gets the operation failed as a protocol error, never an exception.
 */
import { Readable, Writable } from 'node:stream';
import { Kind, MAX_TO_GUEST_PAYLOAD, frameHeader } from './port-frames.js';
import { transferGc } from './young-gc.js';

/** Codes the guest reports an operation's failure with (files_ops.OpError). */
export type FileErrorCode =
  | 'file_not_found'
  | 'is_a_directory'
  | 'not_a_directory'
  | 'invalid_path'
  | 'sandbox_disk_full'
  | 'permission_denied'
  | 'file_too_large'
  | 'unsupported_file'
  | 'invalid_archive'
  | 'bad_request'
  | 'io_error'
  | 'unknown_user';

const FILE_ERROR_CODES: ReadonlySet<string> = new Set<FileErrorCode>([
  'file_not_found',
  'is_a_directory',
  'not_a_directory',
  'invalid_path',
  'sandbox_disk_full',
  'permission_denied',
  'file_too_large',
  'unsupported_file',
  'invalid_archive',
  'bad_request',
  'io_error',
  'unknown_user',
]);

/**
 * The guest refused or failed the operation: core maps `code` and `reason` to its error
 * registry (file_not_found -> fileNotFound, ...). `reason` is the guest's word for why (a token
 * such as `symlink_leads_out`, checked to be one; guest/PROTOCOL.md), `member` the tar member
 * it was about. `detail` is the guest's own words, for logs only: clients never see them.
 */
export class FileOpError extends Error {
  constructor(
    readonly code: FileErrorCode,
    readonly path: string,
    readonly detail: string,
    readonly reason: string | null = null,
    readonly member: string | null = null,
  ) {
    super(`${code}: ${detail}`);
    this.name = 'FileOpError';
  }
}

/** A reason token: a short lower-case word, never free text. */
const REASON = /^[a-z][a-z_]{0,39}$/;
/** Tar member names are the client's own; a longer one is cut, as it is only shown. */
const MAX_MEMBER_CHARS = 256;

/**
 * The operation did not complete for a reason that is not about the file: the channel closed
 * (VM gone), a second operation was started while one runs (a bug: hostd queues them), the
 * guest did not answer a hello in time or sent garbage, or the caller cancelled it.
 */
export type FileChannelFailure = 'closed' | 'busy' | 'timeout' | 'protocol' | 'cancelled';

/** See FileChannelFailure: the api layer maps these to executor errors (or 404, 499). */
export class FileChannelError extends Error {
  constructor(
    readonly reason: FileChannelFailure,
    message: string,
  ) {
    super(message);
    this.name = 'FileChannelError';
  }
}

/** `other`: FIFOs, sockets, devices; the API shows them but never reads them. */
export type EntryType = 'file' | 'dir' | 'symlink' | 'other';

/** docs/api.md, "Files": an entry of a listing, or a stat. */
export interface FileEntry {
  name: string;
  path: string;
  type: EntryType;
  size: number;
  /** Permission bits, e.g. 420 for 0644. */
  mode: number;
  mtime_ms: number;
  /** Symbolic links only: where it points (null if it could not be read). */
  target?: string | null;
}

/** The guest's answer to an upload: the normalised path, and the bytes written. */
export interface WriteResult {
  path: string;
  size: number;
}

/** The guest's answer to a tar extraction (docs/api.md: `{path, files, size}`). */
export interface ExtractResult {
  path: string;
  /** Members extracted, directories included. */
  files: number;
  /** Bytes of regular files extracted. */
  size: number;
}

/** What an operation may ask of the channel that runs it. */
export interface OpLink {
  /** Writes frames in one go; false when the socket wants a 'drain' first. */
  send(buffers: Buffer[]): boolean;
  /** Calls back once the socket drained, or with an error if it closed first. */
  whenDrained(cb: (err?: Error) => void): void;
  /** Stops or restarts reading the port (a download's consumer is slow, then reads again). */
  pauseInput(): void;
  resumeInput(): void;
  /** The frames starting the operation: its request, after a hello when one is due. */
  request(id: number, msg: Record<string, unknown>): Buffer[];
  /**
   * Holds what is sent until the event loop's next turn, so that frames written in this one
   * leave in one write (a small upload: request, data and end; one wake-up of the guest).
   */
  coalesce(): void;
  /** Asks the guest to stop the operation; its `done` still ends it. */
  cancel(op: FileOp): void;
  /** The guest sent something impossible for this operation. */
  protocolError(reason: string): void;
}

/** An operation in progress. The channel calls head/data for its frames, finish() once. */
export abstract class FileOp {
  finished = false;
  /** Set by the channel when a cancel went out. */
  cancelSent = false;
  /** Called once when the operation is over (the channel unhooks its abort signal). */
  onFinish: (() => void) | null = null;

  constructor(
    readonly id: number,
    readonly path: string,
    protected readonly link: OpLink,
  ) {}

  /** Whether the request has gone to the guest (an upload's waits for its first bytes). */
  get started(): boolean {
    return true;
  }

  head(_msg: Record<string, unknown>): void {
    this.link.protocolError('a head frame for an operation that has none');
  }

  data(_piece: Buffer): void {
    this.link.protocolError('data frames for an operation that has none');
  }

  /** The caller gave up (its abort signal fired). */
  abort(_err: Error): void {
    this.link.cancel(this);
  }

  /** The operation is over: `err` when it did not reach its `done`, else the done message. */
  finish(err: Error | null, done: Record<string, unknown> | null): void {
    if (this.finished) return;
    this.finished = true;
    this.onFinish?.();
    this.settle(err ?? this.failure(done));
  }

  protected abstract settle(err: Error | null): void;

  /** A `done` that cannot be right: the guest is not trusted to be in step any more. */
  protected malformed(what: string): Error {
    this.link.protocolError(what);
    return new FileChannelError('protocol', `the guest's files server sent ${what}`);
  }

  protected failure(done: Record<string, unknown> | null): Error | null {
    if (done?.ok === true) return null;
    if (done?.code === 'cancelled') {
      return new FileChannelError('cancelled', `the operation on ${this.path} was cancelled`);
    }
    const code =
      typeof done?.code === 'string' && FILE_ERROR_CODES.has(done.code) ? done.code : 'io_error';
    const message = typeof done?.message === 'string' ? done.message.slice(0, 500) : 'failed';
    const reason =
      typeof done?.reason === 'string' && REASON.test(done.reason) ? done.reason : null;
    const member = typeof done?.member === 'string' ? done.member.slice(0, MAX_MEMBER_CHARS) : null;
    return new FileOpError(code as FileErrorCode, this.path, message, reason, member);
  }
}

/** Keeps a rejection that nobody awaits from becoming an unhandled rejection (and a crash). */
function quiet<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => undefined);
  return promise;
}

function deferred<T>(): {
  promise: Promise<T>;
  resolve: (v: T) => void;
  reject: (e: Error) => void;
} {
  let resolve!: (v: T) => void;
  let reject!: (e: Error) => void;
  const promise = quiet(
    new Promise<T>((res, rej) => {
      resolve = res;
      reject = rej;
    }),
  );
  return { promise, resolve, reject };
}

/** A request answered by one `done`: list, stat, mkdir, remove. */
export class RequestOp<T> extends FileOp {
  private readonly result = deferred<T>();
  private done: Record<string, unknown> | null = null;

  constructor(
    id: number,
    path: string,
    link: OpLink,
    private readonly parse: (done: Record<string, unknown>) => T | null,
  ) {
    super(id, path, link);
  }

  get promise(): Promise<T> {
    return this.result.promise;
  }

  override finish(err: Error | null, done: Record<string, unknown> | null): void {
    this.done = done;
    super.finish(err, done);
  }

  protected settle(err: Error | null): void {
    if (err) return this.result.reject(err);
    const value = this.done ? this.parse(this.done) : null;
    if (value === null) {
      this.result.reject(this.malformed(`a malformed answer for ${this.path}`));
    } else {
      this.result.resolve(value);
    }
  }
}

/**
 * An upload (write, tar_in): a Writable whose chunks become data frames. Backpressure: a
 * write completes when the socket took it, or once it drained. The request itself waits for
 * the first bytes, so a small file leaves in one write. The Writable's final callback waits
 * for the guest's `done`, so `stream.pipeline(body, sink)` settles with the operation; an
 * early refusal (uploading onto a directory) fails the next write.
 */
export class UploadOp<R> extends FileOp {
  readonly sink: Writable;
  private readonly result = deferred<R>();
  private requested = false;
  private done: Record<string, unknown> | null = null;
  private error: Error | null = null;

  constructor(
    id: number,
    path: string,
    link: OpLink,
    private readonly request: Record<string, unknown>,
    private readonly parse: (done: Record<string, unknown>) => R | null,
  ) {
    super(id, path, link);
    this.sink = new Writable({
      highWaterMark: 64 * 1024,
      writev: (chunks, cb) =>
        this.write(
          chunks.map((c) => c.chunk as Buffer),
          cb,
        ),
      final: (cb) => this.end(cb),
      destroy: (err, cb) => {
        if (!this.finished) this.link.cancel(this);
        cb(err);
      },
    });
    this.sink.on('error', () => undefined); // its error is also `done`'s: no crash if unheard
  }

  override get started(): boolean {
    return this.requested;
  }

  get promise(): Promise<R> {
    return this.result.promise;
  }

  override abort(err: Error): void {
    this.sink.destroy(err);
  }

  /** Sends everything at once: request, data and end. */
  sendWhole(content: Buffer): void {
    this.link.send([...this.take(), ...dataFrames(this.id, content), endFrame(this.id)]);
  }

  /** The request's frames the first time, nothing after. */
  private take(): Buffer[] {
    if (this.requested) return [];
    this.requested = true;
    this.link.coalesce();
    return this.link.request(this.id, this.request);
  }

  private write(chunks: Buffer[], cb: (err?: Error | null) => void): void {
    if (this.finished) return cb(this.error ?? new FileChannelError('protocol', 'upload over'));
    const frames = this.take();
    for (const chunk of chunks) {
      frames.push(...dataFrames(this.id, chunk));
      transferGc.add(chunk.length);
    }
    if (this.link.send(frames)) cb();
    else this.link.whenDrained((err) => cb(err ?? (this.finished ? this.error : null)));
  }

  private end(cb: (err?: Error | null) => void): void {
    if (!this.finished) this.link.send([...this.take(), endFrame(this.id)]);
    this.result.promise.then(
      () => cb(),
      (err: Error) => cb(err),
    );
  }

  override finish(err: Error | null, done: Record<string, unknown> | null): void {
    this.done = done;
    super.finish(err, done);
  }

  protected settle(err: Error | null): void {
    const value = err ? null : this.done && this.parse(this.done);
    if (err || value === null || value === undefined) {
      this.error = err ?? this.malformed(`a malformed answer for ${this.path}`);
      this.result.reject(this.error);
    } else {
      this.result.resolve(value);
    }
  }
}

/**
 * A download (read, tar_out): frames go into a Readable as they arrive (views of the socket's
 * chunks, no copy); when it is full the socket stops being read, QEMU stops draining the
 * virtio queue and the guest blocks: memory stays bounded end to end. Destroying the
 * Readable (the client left) cancels the operation.
 */
export class DownloadOp extends FileOp {
  readonly stream: Readable;
  private readonly headSeen = deferred<number | null>();
  private readonly result = deferred<void>();
  private size: number | null = null;
  private received = 0;
  private gotHead = false;

  constructor(
    id: number,
    path: string,
    link: OpLink,
    private readonly sized: boolean,
  ) {
    super(id, path, link);
    this.stream = new Readable({
      highWaterMark: 64 * 1024,
      read: () => this.link.resumeInput(),
      destroy: (err, cb) => {
        if (!this.finished) this.link.cancel(this);
        cb(err);
      },
    });
    this.stream.on('error', () => undefined); // also `done`'s error: no crash if unheard
  }

  override abort(err: Error): void {
    this.stream.destroy(err);
  }

  /** Resolves with the announced size (null for a tar) once the guest starts sending. */
  get announced(): Promise<number | null> {
    return this.headSeen.promise;
  }

  get done(): Promise<void> {
    return this.result.promise;
  }

  override head(msg: Record<string, unknown>): void {
    const size = msg.size;
    if (this.gotHead || (this.sized && !(Number.isSafeInteger(size) && (size as number) >= 0))) {
      return this.link.protocolError('a malformed head frame');
    }
    this.gotHead = true;
    this.size = this.sized ? (size as number) : null;
    this.headSeen.resolve(this.size);
  }

  override data(piece: Buffer): void {
    this.received += piece.length;
    transferGc.add(piece.length);
    if (!this.gotHead || (this.size !== null && this.received > this.size)) {
      return this.link.protocolError('more data than announced');
    }
    if (this.stream.destroyed) return; // cancelled: what is still in flight is dropped
    if (!this.stream.push(piece)) this.link.pauseInput();
  }

  protected settle(err: Error | null): void {
    if (!err && !this.gotHead) err = this.malformed('a done without a head');
    if (!err && this.size !== null && this.received !== this.size) {
      err = this.malformed(`${this.received} bytes of the ${this.size} announced`);
    }
    if (err) {
      this.headSeen.reject(err);
      this.stream.destroy(err);
      this.result.reject(err);
      return;
    }
    this.stream.push(null);
    this.result.resolve();
  }
}

function dataFrames(id: number, chunk: Buffer): Buffer[] {
  const frames: Buffer[] = [];
  for (let off = 0; off < chunk.length; off += MAX_TO_GUEST_PAYLOAD) {
    const piece = chunk.subarray(off, off + MAX_TO_GUEST_PAYLOAD);
    frames.push(frameHeader(Kind.data, id, piece.length), piece);
  }
  return frames;
}

function endFrame(id: number): Buffer {
  return frameHeader(Kind.end, id, 0);
}

// ---- validation of what the guest answers ---------------------------------------------

const ENTRY_TYPES: ReadonlySet<string> = new Set(['file', 'dir', 'symlink', 'other']);
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** The guest's answers, checked field by field: null for anything malformed. */
export function toEntry(value: unknown): FileEntry | null {
  if (typeof value !== 'object' || value === null) return null;
  const e = value as Record<string, unknown>;
  if (
    typeof e.name !== 'string' ||
    typeof e.path !== 'string' ||
    typeof e.type !== 'string' ||
    !ENTRY_TYPES.has(e.type) ||
    !isCount(e.size) ||
    !isCount(e.mode) ||
    !Number.isSafeInteger(e.mtime_ms)
  ) {
    return null;
  }
  const entry: FileEntry = {
    name: e.name,
    path: e.path,
    type: e.type as EntryType,
    size: e.size,
    mode: e.mode,
    mtime_ms: e.mtime_ms as number,
  };
  if (entry.type === 'symlink') entry.target = typeof e.target === 'string' ? e.target : null;
  return entry;
}

export function toEntries(done: Record<string, unknown>): FileEntry[] | null {
  if (!Array.isArray(done.entries)) return null;
  const entries = done.entries.map(toEntry);
  return entries.every((e) => e !== null) ? (entries as FileEntry[]) : null;
}

export function toWriteResult(done: Record<string, unknown>): WriteResult | null {
  return typeof done.path === 'string' && isCount(done.size)
    ? { path: done.path, size: done.size }
    : null;
}

export function toExtractResult(done: Record<string, unknown>): ExtractResult | null {
  return typeof done.path === 'string' && isCount(done.files) && isCount(done.size)
    ? { path: done.path, files: done.files, size: done.size }
    : null;
}
