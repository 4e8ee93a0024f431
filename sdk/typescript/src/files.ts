/**
 * `sandbox.files`: reading and writing a sandbox's files without going through code (docs/api.md,
 * "Files"). Both directions stream: uploads are read from their source as hostd takes them,
 * downloads written as they arrive. File operations have their own lane on the server, so they
 * do not wait behind a running exec.
 */
import type { IncomingMessage } from 'node:http';
import { PassThrough, Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import type { CallOptions, ClientConfig } from './config.js';
import { readAll, request, requestJson, requestText, sandboxPath, streamError } from './http.js';
import type { BodySource } from './http.js';
import { extractTar } from './tar-extract.js';
import { tarDirectory } from './tar-write.js';
import type { EntryInfo, TransferInfo, WriteInfo } from './types.js';

/**
 * What `files.write` takes: text (written as UTF-8), bytes, or a stream of bytes (a Node
 * Readable such as `fs.createReadStream(...)`, a web ReadableStream, any async iterable). A
 * stream can be read only once, so its upload is not retried on a 429 or 503.
 */
export type WriteData =
  | string
  | Uint8Array
  | ArrayBuffer
  | Readable
  | WebReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array>;

export interface WriteOptions extends CallOptions {
  /** Permissions of the file: a number (`0o755`) or an octal string (`'0755'`). Default `0644`. */
  mode?: number | string;
}

export interface RemoveOptions extends CallOptions {
  /** Remove a directory and everything in it; without it, a directory is InvalidRequestError. */
  recursive?: boolean;
}

export class Files {
  readonly #config: ClientConfig;
  readonly #sandboxId: string;

  /** Made by Sandbox; use `sandbox.files`. */
  constructor(sandboxId: string, config: ClientConfig) {
    this.#sandboxId = sandboxId;
    this.#config = config;
  }

  /**
   * Writes `data` to the file at `path` (absolute), replacing it, creating its parent
   * directories. The file appears only once complete: a failed upload leaves nothing.
   *
   * @example
   * await sandbox.files.write('/root/data.csv', createReadStream('data.csv'));
   */
  async write(path: string, data: WriteData, opts: WriteOptions = {}): Promise<WriteInfo> {
    return requestJson<WriteInfo>(this.#config, {
      method: 'PUT',
      path: this.#path(),
      query: { path, mode: modeString(opts.mode) },
      body: bodyOf(data),
      signal: opts.signal,
    });
  }

  /**
   * The bytes of the file at `path`. SandboxFileNotFoundError if there is none; use
   * `readStream` for files too big to hold in memory.
   *
   * @example
   * const text = (await sandbox.files.read('/root/out.txt')).toString('utf8');
   */
  async read(path: string, opts: CallOptions = {}): Promise<Buffer> {
    const res = await this.#get(path, opts);
    return readAll(res, opts.signal);
  }

  /**
   * The file at `path` as a stream, which resolves once hostd has answered (so a missing file
   * rejects here, not in the middle of the stream). Destroying the stream closes the download.
   *
   * @example
   * await pipeline(await sandbox.files.readStream('/root/big.bin'), createWriteStream('big.bin'));
   */
  async readStream(path: string, opts: CallOptions = {}): Promise<Readable> {
    const res = await this.#get(path, opts);
    const out = new PassThrough();
    res.on('error', (err) => out.destroy(streamError(err, opts.signal) as Error));
    out.on('close', () => {
      if (!res.complete) res.destroy();
    });
    return res.pipe(out);
  }

  /** The entries of directory `path`, one level, sorted by name. */
  async list(path: string, opts: CallOptions = {}): Promise<EntryInfo[]> {
    const body = await requestJson<{ entries: EntryInfo[] }>(this.#config, {
      method: 'GET',
      path: this.#path('/list'),
      query: { path },
      signal: opts.signal,
    });
    return body.entries;
  }

  /** What is at `path` (a symlink is described, not followed). */
  async stat(path: string, opts: CallOptions = {}): Promise<EntryInfo> {
    return requestJson<EntryInfo>(this.#config, {
      method: 'GET',
      path: this.#path('/stat'),
      query: { path },
      signal: opts.signal,
    });
  }

  /** Creates directory `path` and its parents; no error if it exists. */
  async mkdir(path: string, opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'POST',
      path: this.#path('/mkdir'),
      query: { path },
      signal: opts.signal,
    });
  }

  /**
   * Renames `path` to `to` (a file or a whole directory), making `to`'s parents; resolves with
   * the new path. A file at `to` is replaced.
   */
  async move(path: string, to: string, opts: CallOptions = {}): Promise<string> {
    const body = await requestJson<{ path: string }>(this.#config, {
      method: 'POST',
      path: this.#path('/move'),
      query: { path, to },
      signal: opts.signal,
    });
    return body.path;
  }

  /** Removes the file or symlink at `path`, or a whole directory with `recursive: true`. */
  async remove(path: string, opts: RemoveOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'DELETE',
      path: this.#path(),
      query: { path, recursive: opts.recursive ? '1' : undefined },
      signal: opts.signal,
    });
  }

  /**
   * Uploads everything under the local directory `localDir` into `remoteDir` (created if
   * missing) as one tar stream. Symlinks are sent as links.
   *
   * @example
   * const { files, size } = await sandbox.files.uploadDir('./project', '/root/project');
   */
  async uploadDir(
    localDir: string,
    remoteDir: string,
    opts: CallOptions = {},
  ): Promise<TransferInfo> {
    return requestJson<TransferInfo>(this.#config, {
      method: 'PUT',
      path: this.#path(),
      query: { path: remoteDir },
      // A fresh tar stream for every attempt, so that a 429 or 503 can be retried.
      body: () => Readable.from(tarDirectory(localDir)),
      contentType: 'application/x-tar',
      signal: opts.signal,
    });
  }

  /**
   * Downloads everything under `remoteDir` into the local directory `localDir` (created if
   * missing). The archive comes from untrusted code, so nothing is written outside `localDir`
   * or through a symlink (UnsafeArchiveError). On failure, what arrived so far stays.
   *
   * @example
   * await sandbox.files.downloadDir('/root/results', './results');
   */
  async downloadDir(
    remoteDir: string,
    localDir: string,
    opts: CallOptions = {},
  ): Promise<TransferInfo> {
    const res = await request(this.#config, {
      method: 'GET',
      path: this.#path(),
      query: { path: remoteDir, format: 'tar' },
      accept: 'application/x-tar',
      signal: opts.signal,
    });
    try {
      const { files, size } = await extractTar(mappedErrors(res, opts.signal), localDir);
      return { path: localDir, files, size };
    } finally {
      res.destroy();
    }
  }

  #path(suffix = ''): string {
    return sandboxPath(this.#sandboxId, `/files${suffix}`);
  }

  #get(path: string, opts: CallOptions): Promise<IncomingMessage> {
    return request(this.#config, {
      method: 'GET',
      path: this.#path(),
      query: { path },
      accept: 'application/octet-stream',
      signal: opts.signal,
    });
  }
}

/** The response's chunks, with a broken connection or a timeout as the SDK's errors. */
async function* mappedErrors(
  res: IncomingMessage,
  signal: AbortSignal | undefined,
): AsyncGenerator<Buffer> {
  try {
    for await (const chunk of res) yield chunk as Buffer;
  } catch (err) {
    throw streamError(err, signal);
  }
}

/** `0o755` and `'0755'` both become `'0755'`, the octal string hostd takes. */
export function modeString(mode: number | string | undefined): string | undefined {
  if (mode === undefined || typeof mode === 'string') return mode;
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) {
    throw new RangeError(`mode must be a permission number from 0 to 0o7777, got ${mode}`);
  }
  return mode.toString(8).padStart(4, '0');
}

function bodyOf(data: WriteData): BodySource {
  if (typeof data === 'string') return Buffer.from(data, 'utf8');
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return Buffer.from(data);
  if (data instanceof Readable) return data;
  if (typeof (data as WebReadableStream<Uint8Array>).getReader === 'function') {
    return Readable.fromWeb(data as WebReadableStream<Uint8Array>);
  }
  return Readable.from(data as AsyncIterable<Uint8Array>);
}
