/**
 * `Sandbox`: one hostd sandbox (a microVM with a persistent Python REPL) and what can be done
 * with it. Every method maps onto one HTTP call of docs/api.md.
 */
import {
  resolveConfig,
  type CallOptions,
  type ClientConfig,
  type ConnectionOptions,
} from './config.js';
import { toDisplay } from './display.js';
import { isHostdError } from './errors.js';
import { execEvents } from './exec-stream.js';
import { Files } from './files.js';
import { request, requestJson, requestText, sandboxPath } from './http.js';
import { Snapshot } from './snapshot.js';
import type {
  CellError,
  ContextInfo,
  Display,
  ExecEvent,
  Language,
  RunResult,
  SandboxInfo,
  SnapshotInfo,
} from './types.js';
import type { components } from './wire.gen.js';

export type { CallOptions } from './config.js';

// `await using` needs Symbol.asyncDispose, which Node only has from 18.18 and 20.4.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('nodejs.asyncDispose');

export interface CreateOptions extends ConnectionOptions, CallOptions {
  /** Template name (see `Template.list()`); default: the server's first template (`python`). */
  template?: string;
  /** Start from this snapshot's state instead of a template (not together with `template`). */
  snapshot?: Snapshot | string;
  /**
   * Environment of every exec of this sandbox (bash's environment, Python's `os.environ`);
   * fork children inherit it.
   */
  env?: Record<string, string>;
  /** Outbound network access; without it the sandbox has none. */
  network?: NetworkOptions;
  /** Labels of yours, shown in `info()` and kept with the sandbox; fork children inherit them. */
  metadata?: Record<string, string>;
  /**
   * A lifetime: milliseconds of running time (sent as `timeout` in seconds), after which the
   * sandbox is deleted, or paused with `onTimeout: 'pause'`. Pausing stops the clock; each
   * resume gives the whole lifetime again. Without it the sandbox runs until deleted.
   */
  timeoutMs?: number;
  /** What happens when the lifetime is up: `delete` (the default) or `pause`. */
  onTimeout?: 'delete' | 'pause';
}

export interface SnapshotOptions extends CallOptions {
  /** A name of yours for the snapshot (printable ASCII, at most 128 characters; not unique). */
  name?: string;
}

export interface SetTimeoutOptions extends CallOptions {
  /** What happens when the lifetime is up; kept as it was unless given. */
  onTimeout?: 'delete' | 'pause';
}

export interface NetworkOptions {
  /**
   * Rules for what the sandbox may connect to: `example.com`, `example.com:443`,
   * `*.example.com`, `203.0.113.0/24`, `*` (any public address), `host.hostd.internal:PORT`.
   */
  allowOut?: string[];
}

export interface ExecOptions extends CallOptions {
  /** Default `python` (the persistent REPL); `bash` runs in a fresh process each time. */
  language?: Language;
  /**
   * Interrupt the code after this many milliseconds (sent as `timeout` in seconds); the exec
   * then ends with the stderr line `hostd: execution timed out` and exit code 124. It also
   * bounds how long the SDK waits on a silent stream: this plus `requestTimeoutMs`. Without
   * it, a running exec may stay silent forever.
   */
  timeoutMs?: number;
  /** Extra environment for this exec only, over the sandbox's `env`. */
  env?: Record<string, string>;
  /** Working directory for this exec only (absolute; it must exist). Default `/root`. */
  cwd?: string;
  /**
   * Python only: rich outputs (matplotlib figures, DataFrames, `display(obj)`) come as
   * `display` events, and in `run`'s `displays`.
   */
  display?: boolean;
  /**
   * Python only: the REPL context to run in (see `createContext`); default: the sandbox's own
   * namespace. One the sandbox does not have is a ContextNotFoundError.
   */
  context?: string;
  /**
   * Python only: run as a notebook cell (docs/api.md, Notebook mode): the last expression's
   * value comes as a `result` event (`run`'s `result`), an uncaught exception as an `error`
   * event (`run`'s `error`), rich outputs are on, and IPython's `!cmd` and `%magic` work.
   */
  notebook?: boolean;
}

export interface RunOptions extends ExecOptions {
  /** Called with each stdout line (without its newline) as it arrives. */
  onStdout?: (line: string) => void;
  /** Called with each stderr line (without its newline) as it arrives. */
  onStderr?: (line: string) => void;
  /** Called with each rich output as it arrives (with `display: true`). */
  onDisplay?: (display: Display) => void;
  /** Called with a notebook cell's value when it arrives. */
  onResult?: (result: Display) => void;
  /** Called with a notebook cell's uncaught exception when it arrives. */
  onError?: (error: CellError) => void;
}

export interface CreateContextOptions extends CallOptions {
  /** Its id (1 to 64 letters, digits, `_`, `.`, `-`); default: 16 random hex digits. */
  id?: string;
  /** Its working directory (it must exist); default: the default context's. */
  cwd?: string;
}

/** What create answers, and each child of a fork. */
type CreatedBody = components['schemas']['Sandbox'];

export class Sandbox {
  /** `sbx_` followed by 32 lowercase hex characters. */
  readonly id: string;
  /** The sandbox's files: read, write, list, upload and download directories. */
  readonly files: Files;
  readonly #config: ClientConfig;

  private constructor(id: string, config: ClientConfig) {
    this.id = id;
    this.#config = config;
    this.files = new Files(id, config);
  }

  /**
   * Creates a sandbox, from the template's warm pool when it has one ready, or from a snapshot.
   *
   * @example
   * await using sandbox = await Sandbox.create({ env: { MODE: 'test' } }); // deleted at scope end
   */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const config = resolveConfig(opts);
    const body: Record<string, unknown> = {};
    if (opts.template !== undefined) body.template = opts.template;
    if (opts.snapshot !== undefined) {
      body.snapshot = typeof opts.snapshot === 'string' ? opts.snapshot : opts.snapshot.id;
    }
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.network !== undefined) body.network = { allow_out: opts.network.allowOut ?? [] };
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    if (opts.timeoutMs !== undefined) body.timeout = opts.timeoutMs / 1000;
    if (opts.onTimeout !== undefined) body.on_timeout = opts.onTimeout;
    const created = await requestJson<CreatedBody>(config, {
      method: 'POST',
      path: '/v1/sandboxes',
      json: body,
      signal: opts.signal,
    });
    return new Sandbox(created.id, config);
  }

  /**
   * Attaches to an existing sandbox, checking that it exists (SandboxNotFoundError otherwise).
   *
   * @example
   * const sandbox = await Sandbox.connect('sbx_0123456789abcdef0123456789abcdef');
   */
  static async connect(
    sandboxId: string,
    opts: ConnectionOptions & CallOptions = {},
  ): Promise<Sandbox> {
    const config = resolveConfig(opts);
    const info = await requestJson<SandboxInfo>(config, {
      method: 'GET',
      path: sandboxPath(sandboxId),
      signal: opts.signal,
    });
    return new Sandbox(info.id, config);
  }

  /** Every sandbox on the server, running, paused or failed. */
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<SandboxInfo[]> {
    const body = await requestJson<components['schemas']['SandboxList']>(resolveConfig(opts), {
      method: 'GET',
      path: '/v1/sandboxes',
      signal: opts.signal,
    });
    return body.sandboxes;
  }

  /** The server's description of this sandbox (state, template, parent, busy, network, ...). */
  async info(opts: CallOptions = {}): Promise<SandboxInfo> {
    return requestJson<SandboxInfo>(this.#config, {
      method: 'GET',
      path: sandboxPath(this.id),
      signal: opts.signal,
    });
  }

  /**
   * Runs code and yields its events in `seq` order as they arrive: `stdout` and `stderr` lines,
   * `display` bundles (with `display: true`), then one `exit` with the exit code. The request is
   * sent when iteration starts; leaving the loop early closes the connection, which interrupts
   * the code. A 429 or 503 answer is retried like any request (no event was streamed yet); a
   * failure of the sandbox during the exec raises ExecutorError.
   *
   * @example
   * for await (const event of sandbox.exec('print(1)')) console.log(event.type, event.data);
   */
  async *exec(code: string, opts: ExecOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const body: Record<string, unknown> = { code };
    if (opts.language !== undefined) body.language = opts.language;
    // Bounds are the server's to check (InvalidRequestError), as for fork's n.
    if (opts.timeoutMs !== undefined) body.timeout = opts.timeoutMs / 1000;
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    if (opts.display !== undefined) body.display = opts.display;
    if (opts.context !== undefined) body.context = opts.context;
    if (opts.notebook !== undefined) body.notebook = opts.notebook;
    const silence = this.#config.requestTimeoutMs;
    const res = await request(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/exec'),
      json: body,
      accept: 'application/x-ndjson',
      signal: opts.signal,
      // A running exec may print nothing for as long as its own timeout allows.
      bodyTimeoutMs: opts.timeoutMs !== undefined && silence > 0 ? opts.timeoutMs + silence : 0,
    });
    yield* execEvents(res, opts.signal);
  }

  /**
   * Runs code to completion and collects its output. A non-zero exit code (an uncaught Python
   * exception gives 1) is a result, not an error.
   *
   * @example
   * const { stdout, exitCode } = await sandbox.run('x = 41\nprint(x + 1)'); // '42\n', 0
   */
  async run(code: string, opts: RunOptions = {}): Promise<RunResult> {
    let stdout = '';
    let stderr = '';
    let exitCode = -1;
    const displays: Display[] = [];
    const notebook: Pick<RunResult, 'result' | 'error' | 'executionCount'> = {};
    for await (const event of this.exec(code, opts)) {
      if (event.type === 'exit') {
        exitCode = event.data;
      } else if (event.type === 'stdout') {
        stdout += event.partial ? event.data : `${event.data}\n`;
        opts.onStdout?.(event.data);
      } else if (event.type === 'stderr') {
        stderr += event.partial ? event.data : `${event.data}\n`;
        opts.onStderr?.(event.data);
      } else if (event.type === 'display') {
        const display = toDisplay(event.data);
        displays.push(display);
        opts.onDisplay?.(display);
      } else if (event.type === 'result') {
        notebook.result = toDisplay(event.data);
        opts.onResult?.(notebook.result);
      } else if (event.type === 'error') {
        notebook.error = event.data;
        opts.onError?.(event.data);
      } else {
        notebook.executionCount = event.data;
      }
    }
    return { stdout, stderr, exitCode, displays, ...notebook };
  }

  /**
   * Creates a REPL context: an independent Python namespace with its own working directory,
   * for execs that name it (`context`). Fork children get their parent's contexts.
   *
   * @example
   * const ctx = await sandbox.createContext({ cwd: '/tmp' });
   * await sandbox.run('x = 1', { context: ctx.id });
   */
  async createContext(opts: CreateContextOptions = {}): Promise<ContextInfo> {
    const body: Record<string, unknown> = {};
    if (opts.id !== undefined) body.id = opts.id;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    return requestJson<ContextInfo>(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/contexts'),
      json: body,
      signal: opts.signal,
    });
  }

  /** The sandbox's REPL contexts, `default` (its own namespace) first. */
  async listContexts(opts: CallOptions = {}): Promise<ContextInfo[]> {
    const body = await requestJson<components['schemas']['ContextList']>(this.#config, {
      method: 'GET',
      path: sandboxPath(this.id, '/contexts'),
      signal: opts.signal,
    });
    return body.contexts;
  }

  /** Gives a context a fresh namespace, its first working directory and a count of 0. */
  async restartContext(context: string, opts: CallOptions = {}): Promise<ContextInfo> {
    return requestJson<ContextInfo>(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, `/contexts/${encodeURIComponent(context)}/restart`),
      signal: opts.signal,
    });
  }

  /** Deletes a context (not `default`: restart that one). */
  async deleteContext(context: string, opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'DELETE',
      path: sandboxPath(this.id, `/contexts/${encodeURIComponent(context)}`),
      signal: opts.signal,
    });
  }

  /**
   * Creates `n` (1 to 32) copy-on-write children that start from this sandbox's whole state:
   * REPL variables, files, processes. Children come back in no particular order.
   *
   * @example
   * const [a, b] = await sandbox.fork(2);
   */
  async fork(n: number, opts: CallOptions = {}): Promise<Sandbox[]> {
    const body = await requestJson<components['schemas']['ForkResponse']>(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/fork'),
      json: { n },
      signal: opts.signal,
    });
    return body.children.map((child) => new Sandbox(child.id, this.#config));
  }

  /**
   * Makes this sandbox adopt `winner`'s state: from now on this id drives the winner's VM, this
   * sandbox's previous VM is destroyed, and the winner's id no longer exists.
   *
   * @example
   * await parent.merge(children[0]);
   */
  async merge(winner: Sandbox | string, opts: CallOptions = {}): Promise<void> {
    const winnerId = typeof winner === 'string' ? winner : winner.id;
    await requestText(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, `/merge_into/${encodeURIComponent(winnerId)}`),
      signal: opts.signal,
    });
  }

  /**
   * Saves this sandbox's whole state (memory and files) as a snapshot to create sandboxes from,
   * any number of times. The sandbox keeps running.
   *
   * @example
   * const snap = await sandbox.snapshot();
   * const copy = await Sandbox.create({ snapshot: snap });
   */
  async snapshot(opts: SnapshotOptions = {}): Promise<Snapshot> {
    const info = await requestJson<SnapshotInfo>(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/snapshot'),
      ...(opts.name !== undefined ? { json: { name: opts.name } } : {}),
      signal: opts.signal,
    });
    return new Snapshot(info, this.#config);
  }

  /**
   * Writes the sandbox to disk and stops its VM, so that it costs no host memory; its next use
   * (or `resume`) brings it back with its state. Pausing a paused sandbox does nothing.
   */
  async pause(opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/pause'),
      signal: opts.signal,
    });
  }

  /**
   * Sets the sandbox's lifetime to `timeoutMs` of running time from now (shorter or longer
   * than before); `null` removes it. Returns the sandbox's info, with its new `expires_at`.
   */
  async setTimeout(timeoutMs: number | null, opts: SetTimeoutOptions = {}): Promise<SandboxInfo> {
    const json: Record<string, unknown> = { timeout: timeoutMs === null ? null : timeoutMs / 1000 };
    if (opts.onTimeout !== undefined) json.on_timeout = opts.onTimeout;
    return requestJson<SandboxInfo>(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/timeout'),
      json,
      signal: opts.signal,
    });
  }

  /** Starts a paused sandbox again now, rather than on its next use. */
  async resume(opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'POST',
      path: sandboxPath(this.id, '/resume'),
      signal: opts.signal,
    });
  }

  /** Destroys the sandbox. Deleting it twice is a SandboxNotFoundError. */
  async delete(opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'DELETE',
      path: sandboxPath(this.id),
      signal: opts.signal,
    });
  }

  /** The tail of the VM's console and QEMU's stderr, for debugging a misbehaving guest. */
  async logs(opts: CallOptions = {}): Promise<string> {
    return requestText(this.#config, {
      method: 'GET',
      path: sandboxPath(this.id, '/logs'),
      accept: 'text/plain',
      signal: opts.signal,
    });
  }

  /**
   * `await using sandbox = await Sandbox.create()` deletes the sandbox when the scope ends. A
   * sandbox already gone (deleted, or merged away as a winner) is not an error here.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.delete();
    } catch (err) {
      // `not_found` is what a server too old to send codes says for an unknown sandbox.
      if (!isHostdError(err) || (err.code !== 'sandbox_not_found' && err.code !== 'not_found')) {
        throw err;
      }
    }
  }

  /** So that `console.log(sandbox)` and template strings show the id. */
  toString(): string {
    return this.id;
  }

  toJSON(): { id: string } {
    return { id: this.id };
  }
}
