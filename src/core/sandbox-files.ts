/**
 * The files of a sandbox (docs/api.md, Files): each operation waits for the sandbox's file lane
 * (not behind its execs), resumes a paused sandbox first, streams through the machine's files
 * port, and turns what the guest or the channel reports into registry errors. Transfers stream:
 * nothing here holds a whole file.
 */
import { PassThrough, Transform, type Readable } from 'node:stream';
import type { Logger } from 'pino';
import { fail, HostdError } from '../errors.js';
import {
  FileChannelError,
  FileOpError,
  type DetailedEntry,
  type ExtractResult,
  type FileEntry,
  type GuestFiles,
  type MkdirResult,
  type MoveResult,
  type Upload,
  type UserWriteResult,
  type WriteResult,
} from '../vm/machine.js';
import { clientFileError } from './file-errors.js';
import type { SandboxRegistry } from './registry.js';
import { clientReason } from './machine-error.js';
import type { Release } from './serial-queue.js';

export type {
  DetailedEntry,
  ExtractResult,
  FileEntry,
  MkdirResult,
  MoveResult,
  UserWriteResult,
  WriteResult,
} from '../vm/machine.js';

/** A download in progress: the lane is held until `stream` ended or failed. */
export interface FileDownload {
  /** Bytes to come, when known (a file; not a tar stream). */
  readonly size: number | null;
  readonly stream: Readable;
}

interface Lease {
  readonly files: GuestFiles;
  readonly release: Release;
  readonly held: () => boolean;
}

export class SandboxFiles {
  constructor(
    private readonly registry: SandboxRegistry,
    private readonly log: Logger,
    /** SERVICE_MAX_FILE_BYTES: uploads past it fail with 413. */
    private readonly maxFileBytes: number,
  ) {}

  /** Writes `body` to `path` (replacing it); it appears only once complete. */
  write(
    id: string,
    path: string,
    mode: number,
    body: Readable,
    signal: AbortSignal,
  ): Promise<WriteResult> {
    return this.upload(id, path, body, signal, (files, opSignal) =>
      files.writeFile(path, { mode, signal: opSignal }),
    );
  }

  /** Extracts the tar stream `body` into directory `path`. */
  extract(id: string, path: string, body: Readable, signal: AbortSignal): Promise<ExtractResult> {
    return this.upload(id, path, body, signal, (files, opSignal) =>
      files.tarIn(path, { signal: opSignal }),
    );
  }

  /** The bytes of file `path`. */
  read(id: string, path: string, signal: AbortSignal): Promise<FileDownload> {
    return this.download(id, path, signal, (files) => files.readFile(path, { signal }));
  }

  /** Directory (or file) `path` as a tar stream. */
  tar(id: string, path: string, signal: AbortSignal): Promise<FileDownload> {
    return this.download(id, path, signal, (files) => files.tarOut(path, { signal }));
  }

  list(id: string, path: string, signal: AbortSignal): Promise<FileEntry[]> {
    return this.simple(id, path, signal, (files) => files.list(path, { signal }));
  }

  stat(id: string, path: string, signal: AbortSignal): Promise<FileEntry> {
    return this.simple(id, path, signal, (files) => files.stat(path, { signal }));
  }

  mkdir(id: string, path: string, signal: AbortSignal): Promise<string> {
    return this.simple(id, path, signal, (files) => files.mkdir(path, { signal }));
  }

  remove(id: string, path: string, recursive: boolean, signal: AbortSignal): Promise<void> {
    return this.simple(id, path, signal, (files) => files.remove(path, { recursive, signal }));
  }

  /** Renames `source` to `destination` (absolute paths; as `user` when given: see below). */
  move(
    id: string,
    source: string,
    destination: string,
    signal: AbortSignal,
    user?: string,
  ): Promise<MoveResult> {
    return this.simple(
      id,
      source,
      signal,
      (files) =>
        files.move(source, destination, { signal, ...(user !== undefined ? { user } : {}) }),
      user,
    );
  }

  // ---- as a user (guest/PROTOCOL.md, "As a user"): what E2B's filesystem API means --------
  // Paths may be relative to the user's home; what is created belongs to the user; entries
  // are detailed (owner, group, permissions); writes go in place with optional metadata.

  writeAs(
    id: string,
    user: string,
    path: string,
    body: Readable,
    signal: AbortSignal,
    metadata?: Readonly<Record<string, string>>,
  ): Promise<UserWriteResult> {
    return this.upload(
      id,
      path,
      body,
      signal,
      (files, opSignal) =>
        files.writeFileAs(user, path, { signal: opSignal, ...(metadata ? { metadata } : {}) }),
      user,
    );
  }

  readAs(id: string, user: string, path: string, signal: AbortSignal): Promise<FileDownload> {
    return this.download(
      id,
      path,
      signal,
      (files) => files.readFileAs(user, path, { signal }),
      user,
    );
  }

  statAs(id: string, user: string, path: string, signal: AbortSignal): Promise<DetailedEntry> {
    return this.simple(id, path, signal, (files) => files.statAs(user, path, { signal }), user);
  }

  /** The entries `depth` levels below `path`: a pre-order walk sorted by name at each level. */
  listAs(
    id: string,
    user: string,
    path: string,
    depth: number,
    signal: AbortSignal,
  ): Promise<DetailedEntry[]> {
    return this.simple(
      id,
      path,
      signal,
      (files) => files.listAs(user, path, depth, { signal }),
      user,
    );
  }

  mkdirAs(id: string, user: string, path: string, signal: AbortSignal): Promise<MkdirResult> {
    return this.simple(id, path, signal, (files) => files.mkdirAs(user, path, { signal }), user);
  }

  /** rm -rf; false when there was nothing to remove. */
  removeAs(id: string, user: string, path: string, signal: AbortSignal): Promise<boolean> {
    return this.simple(id, path, signal, (files) => files.removeAs(user, path, { signal }), user);
  }

  private async lease(id: string, signal: AbortSignal): Promise<Lease> {
    const { sandbox, release } = await this.registry.acquireFiles(id, signal);
    const { machine } = sandbox;
    sandbox.touch();
    return {
      files: machine.files,
      release,
      held: () => this.registry.holds(sandbox) && sandbox.machine === machine,
    };
  }

  private async simple<T>(
    id: string,
    path: string,
    signal: AbortSignal,
    op: (files: GuestFiles) => Promise<T>,
    user?: string,
  ): Promise<T> {
    const lease = await this.lease(id, signal);
    try {
      return await op(lease.files);
    } catch (err) {
      throw this.translate(err, id, path, lease, user);
    } finally {
      lease.release();
    }
  }

  private async upload<R>(
    id: string,
    path: string,
    body: Readable,
    signal: AbortSignal,
    start: (files: GuestFiles, signal: AbortSignal) => Upload<R>,
    user?: string,
  ): Promise<R> {
    const lease = await this.lease(id, signal);
    // Ends the guest's side when the body is over the limit or broke off.
    const stop = new AbortController();
    let tooLarge: HostdError | null = null;
    try {
      const upload = start(lease.files, AbortSignal.any([signal, stop.signal]));
      const limit = this.limit();
      // Not pipeline(): it would destroy the request, and with it the connection the error
      // answer goes out on. The rest of a refused body is read and dropped instead.
      const drop = (): void => {
        body.unpipe(limit);
        body.resume();
      };
      limit.on('error', (err: HostdError) => {
        tooLarge = err;
        drop();
        stop.abort();
      });
      body.on('error', () => stop.abort());
      upload.sink.on('error', drop);
      body.pipe(limit).pipe(upload.sink);
      try {
        return await upload.done;
      } catch (err) {
        drop(); // the guest refused before the body was in
        throw tooLarge ?? err;
      }
    } catch (err) {
      throw this.translate(err, id, path, lease, user);
    } finally {
      lease.release();
    }
  }

  private async download(
    id: string,
    path: string,
    signal: AbortSignal,
    start: (files: GuestFiles) => Promise<{
      size: number | null;
      stream: Readable;
      done: Promise<void>;
    }>,
    user?: string,
  ): Promise<FileDownload> {
    const lease = await this.lease(id, signal);
    let started;
    try {
      started = await start(lease.files);
    } catch (err) {
      lease.release();
      throw this.translate(err, id, path, lease, user);
    }
    // The lane is the transfer's until the guest said it is over (or it failed).
    started.done.then(lease.release, (err: unknown) => {
      lease.release();
      this.log.debug({ err, sandbox: id, path }, 'download ended early');
    });
    return { size: started.size, stream: this.clientSide(started.stream, id, path, lease) };
  }

  /**
   * The download as its client gets it: a failure after the guest's head (a file that shrank,
   * the VM gone) errors the stream with a registry error, never with the guest's words. It can
   * still become the HTTP answer when it comes before the first byte went out (a small file's
   * head, data and done arrive together). Destroying it (the client left) cancels the transfer.
   */
  private clientSide(source: Readable, id: string, path: string, lease: Lease): Readable {
    const out = new PassThrough({ highWaterMark: 64 * 1024 });
    source.on('error', (err) => out.destroy(this.translate(err, id, path, lease)));
    out.on('close', () => {
      if (!source.readableEnded) source.destroy();
    });
    source.pipe(out);
    return out;
  }

  /** Counts an upload's bytes: past SERVICE_MAX_FILE_BYTES it fails, before the guest renames. */
  private limit(): Transform {
    let bytes = 0;
    const max = this.maxFileBytes;
    return new Transform({
      transform(chunk: Buffer, _encoding, callback) {
        bytes += chunk.length;
        if (bytes > max) callback(fail('fileTooLarge', max));
        else callback(null, chunk);
      },
    });
  }

  /** What the guest or the channel said, as a registry error; never in the guest's words. */
  private translate(err: unknown, id: string, path: string, lease: Lease, user?: string): Error {
    if (err instanceof HostdError) return err;
    if (err instanceof FileOpError) {
      if (err.code === 'unknown_user') return fail('unknownUser', user ?? '');
      const client = clientFileError(err, id, path);
      if (client) {
        this.log.debug({ sandbox: id, path, detail: err.detail }, 'file operation refused');
        return client;
      }
      this.log.warn({ sandbox: id, path, code: err.code, detail: err.detail }, 'guest file error');
      return fail(
        'vmOperationFailed',
        'complete the file operation',
        'the sandbox reported an internal failure',
      );
    }
    if (!lease.held()) return fail('sandboxDeleted', id);
    if (err instanceof FileChannelError && err.reason === 'cancelled') {
      return fail('requestAborted', 'during the file transfer');
    }
    // The raw text (a channel's, a host error's) goes to the log; the client reads its kind.
    this.log.warn({ err, sandbox: id, path }, 'file operation failed');
    return fail('vmOperationFailed', 'complete the file operation', clientReason(err));
  }
}
