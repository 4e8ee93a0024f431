/**
 * `Sandbox`: one hostd sandbox (a microVM with a persistent Python REPL) and what can be done
 * with it. Every method maps onto one HTTP call of docs/api.md.
 */
import { resolveConfig, type ClientConfig, type ConnectionOptions } from './config.js';
import { ExecutorError } from './errors.js';
import { execEvents } from './exec-stream.js';
import { request, requestJson, requestText, sandboxPath } from './http.js';
import type { ExecEvent, Language, RunResult, SandboxInfo } from './types.js';

/** Options of every call: aborting the signal aborts the request (and rejects with its reason). */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface CreateOptions extends ConnectionOptions, CallOptions {
  /** Template (pool) name; default: the server's first template (`python`). */
  template?: string;
}

export interface ExecOptions extends CallOptions {
  /** Default `python` (the persistent REPL); `bash` runs in a fresh process each time. */
  language?: Language;
  /**
   * Interrupt the code after this many milliseconds (sent as `timeout` in seconds); the exec
   * then ends with the stderr line `hostd: execution timed out` and exit code 124.
   */
  timeoutMs?: number;
}

export interface RunOptions extends ExecOptions {
  /** Called with each stdout line (without its newline) as it arrives. */
  onStdout?: (line: string) => void;
  /** Called with each stderr line (without its newline) as it arrives. */
  onStderr?: (line: string) => void;
}

interface CreatedBody {
  id: string;
  state: string;
}

export class Sandbox {
  /** `sbx_` followed by 32 lowercase hex characters. */
  readonly id: string;
  readonly #config: ClientConfig;

  private constructor(id: string, config: ClientConfig) {
    this.id = id;
    this.#config = config;
  }

  /**
   * Creates a sandbox, from the template's warm pool when it has one ready.
   *
   * @example
   * const sandbox = await Sandbox.create();
   */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const config = resolveConfig(opts);
    const body = opts.template === undefined ? {} : { template: opts.template };
    const created = await requestJson<CreatedBody>(config, 'POST', '/v1/sandboxes', {
      body,
      signal: opts.signal,
    });
    return new Sandbox(created.id, config);
  }

  /**
   * Attaches to an existing sandbox, checking that it exists (NotFoundError otherwise).
   *
   * @example
   * const sandbox = await Sandbox.connect('sbx_0123456789abcdef0123456789abcdef');
   */
  static async connect(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<Sandbox> {
    const config = resolveConfig(opts);
    const info = await requestJson<SandboxInfo>(config, 'GET', sandboxPath(id), {
      signal: opts.signal,
    });
    return new Sandbox(info.id, config);
  }

  /** Every live sandbox on the server. */
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<SandboxInfo[]> {
    const config = resolveConfig(opts);
    const body = await requestJson<{ sandboxes: SandboxInfo[] }>(config, 'GET', '/v1/sandboxes', {
      signal: opts.signal,
    });
    return body.sandboxes;
  }

  /** The server's description of this sandbox (template, parent, busy, ...). */
  async info(opts: CallOptions = {}): Promise<SandboxInfo> {
    return requestJson<SandboxInfo>(this.#config, 'GET', sandboxPath(this.id), {
      signal: opts.signal,
    });
  }

  /**
   * Runs code and yields its events in `seq` order as they arrive: `stdout` and `stderr` lines,
   * then one `exit` with the exit code. The request is sent when iteration starts; leaving the
   * loop early closes the connection, which interrupts the code. A failure of the sandbox
   * during the exec raises ExecutorError.
   *
   * @example
   * for await (const event of sandbox.exec('print(1)')) console.log(event.type, event.data);
   */
  async *exec(code: string, opts: ExecOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const body: { code: string; language?: Language; timeout?: number } = { code };
    if (opts.language !== undefined) body.language = opts.language;
    // Bounds are the server's to check (InvalidRequestError), as for fork's n.
    if (opts.timeoutMs !== undefined) body.timeout = opts.timeoutMs / 1000;
    const res = await request(this.#config, 'POST', sandboxPath(this.id, '/exec'), {
      body,
      signal: opts.signal,
      accept: 'application/x-ndjson',
    });
    if (!res.body) throw new ExecutorError('the exec response has no body');
    yield* execEvents(res.body, opts.signal);
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
    for await (const event of this.exec(code, opts)) {
      if (event.type === 'exit') {
        exitCode = event.data;
      } else if (event.type === 'stdout') {
        stdout += `${event.data}\n`;
        opts.onStdout?.(event.data);
      } else {
        stderr += `${event.data}\n`;
        opts.onStderr?.(event.data);
      }
    }
    return { stdout, stderr, exitCode };
  }

  /**
   * Creates `n` (1 to 32) copy-on-write children that start from this sandbox's whole state:
   * REPL variables, files, processes. Children come back in no particular order.
   *
   * @example
   * const [a, b] = await sandbox.fork(2);
   */
  async fork(n: number, opts: CallOptions = {}): Promise<Sandbox[]> {
    const body = await requestJson<{ children: CreatedBody[] }>(
      this.#config,
      'POST',
      sandboxPath(this.id, '/fork'),
      { body: { n }, signal: opts.signal },
    );
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
    await requestText(
      this.#config,
      'POST',
      sandboxPath(this.id, `/merge_into/${encodeURIComponent(winnerId)}`),
      {
        signal: opts.signal,
      },
    );
  }

  /** Destroys the sandbox. Deleting it twice is a NotFoundError. */
  async delete(opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, 'DELETE', sandboxPath(this.id), { signal: opts.signal });
  }

  /** The tail of the VM's console and QEMU's stderr, for debugging a misbehaving guest. */
  async logs(opts: CallOptions = {}): Promise<string> {
    return requestText(this.#config, 'GET', sandboxPath(this.id, '/logs'), {
      signal: opts.signal,
      accept: 'text/plain',
    });
  }

  /** So that `console.log(sandbox)` and template strings show the id. */
  toString(): string {
    return this.id;
  }

  toJSON(): { id: string } {
    return { id: this.id };
  }
}
