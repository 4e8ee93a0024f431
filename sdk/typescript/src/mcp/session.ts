/**
 * One MCP session's hold on hostd: where hostd is and with which key, the sandboxes the session
 * created (so that they go when it ends, and no agent that forgets to clean up leaves VMs
 * behind), and its default sandbox, the one `run_code` uses when given no id (a model that
 * omits the id still gets notebook continuity).
 */
import { resolveConfig, type ConnectionOptions } from '../config.js';
import { isHostdError } from '../errors.js';
import { requestText, sandboxPath } from '../http.js';
import { Sandbox } from '../sandbox.js';

/**
 * What happens to the sandboxes a session created when it ends: `delete` frees them at once,
 * `pause` keeps their state on disk (hostd deletes paused sandboxes after its paused TTL),
 * `keep` leaves them running for hostd's idle timeout to handle.
 */
export type SessionEndAction = 'delete' | 'pause' | 'keep';

export const SESSION_END_ACTIONS: readonly SessionEndAction[] = ['delete', 'pause', 'keep'];

/** Where the session's log lines go: stderr for `sbx mcp`, hostd's logger for `/mcp`. */
export type McpLog = (
  level: 'info' | 'warn',
  message: string,
  fields?: Record<string, unknown>,
) => void;

export interface McpSessionOptions {
  /** The hostd the tools drive. Default: SERVICE_HOSTD_URL and SERVICE_API_KEY, as the SDK. */
  connection?: ConnectionOptions;
  /** Default `delete`. */
  sessionEnd?: SessionEndAction;
  /** Text characters one tool result carries at most (DEFAULT_MAX_OUTPUT_CHARS). */
  maxOutputChars?: number;
  log?: McpLog;
}

/** What `end` did with the session's sandboxes. */
export interface SessionEndReport {
  action: SessionEndAction;
  /** Sandboxes deleted, paused, or (for `keep`) left. */
  done: string[];
  /** Already gone (deleted or merged away by someone else). */
  gone: string[];
  /** Sandboxes the action failed on, with the reason. */
  failed: { id: string; error: string }[];
}

export class McpSession {
  readonly connection: ConnectionOptions;
  readonly sessionEnd: SessionEndAction;
  readonly log: McpLog;
  /** Sandboxes this session created that still exist, as far as it knows. */
  readonly owned = new Set<string>();
  /** The sandbox `run_code` uses without an id, and its template. */
  defaultSandbox: { id: string; template: string } | undefined;
  #ended: Promise<SessionEndReport> | undefined;
  #queue: Promise<unknown> = Promise.resolve();

  constructor(opts: McpSessionOptions = {}) {
    this.connection = opts.connection ?? {};
    this.sessionEnd = opts.sessionEnd ?? 'delete';
    this.log = opts.log ?? (() => undefined);
  }

  /** The sandbox `id`, checked to exist (SandboxNotFoundError otherwise). */
  connect(id: string, signal?: AbortSignal): Promise<Sandbox> {
    return Sandbox.connect(id, { ...this.connection, signal });
  }

  /**
   * Runs `fn` after every earlier `serially` call of this session has settled: for choosing
   * or creating the default sandbox, which parallel tool calls must not each do.
   */
  serially<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.#queue.then(fn, fn);
    this.#queue = result.catch(() => undefined);
    return result;
  }

  /** Records sandboxes the session made. */
  adopt(...ids: string[]): void {
    for (const id of ids) this.owned.add(id);
  }

  /** Records that `id` no longer exists (deleted, or merged away as a winner). */
  forget(id: string): void {
    this.owned.delete(id);
    if (this.defaultSandbox?.id === id) this.defaultSandbox = undefined;
  }

  /** True once `end` was called: tools refuse to create sandboxes that nobody would clean up. */
  get ended(): boolean {
    return this.#ended !== undefined;
  }

  /**
   * Deletes (or pauses) the sandboxes the session created, a few at a time. Idempotent: a
   * second call returns the first one's report.
   */
  end(): Promise<SessionEndReport> {
    this.#ended ??= this.#end();
    return this.#ended;
  }

  async #end(): Promise<SessionEndReport> {
    const report: SessionEndReport = { action: this.sessionEnd, done: [], gone: [], failed: [] };
    const ids = [...this.owned];
    if (this.sessionEnd === 'keep') {
      report.done.push(...ids);
      return report;
    }
    const config = resolveConfig(this.connection);
    const queue = [...ids];
    const worker = async (): Promise<void> => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
        try {
          // As Sandbox.delete and Sandbox.pause, without the lookup Sandbox.connect makes: a
          // sandbox lost in a hostd crash answers that lookup 410 but can still be deleted.
          await requestText(config, {
            method: this.sessionEnd === 'pause' ? 'POST' : 'DELETE',
            path: sandboxPath(id, this.sessionEnd === 'pause' ? '/pause' : ''),
          });
          report.done.push(id);
          if (this.sessionEnd === 'delete') this.owned.delete(id);
        } catch (err) {
          if (isHostdError(err, 'sandbox_not_found') || isHostdError(err, 'sandbox_lost')) {
            report.gone.push(id);
            this.owned.delete(id);
          } else {
            report.failed.push({ id, error: (err as Error).message });
          }
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(4, ids.length) }, worker));
    if (report.failed.length > 0) {
      this.log('warn', `MCP session end: could not ${this.sessionEnd} some sandboxes`, {
        failed: report.failed,
      });
    }
    return report;
  }
}
