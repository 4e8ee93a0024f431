/**
 * hostd's MCP server over Streamable HTTP, for any Node HTTP server to mount at a path (hostd
 * mounts it at `/mcp`). Each MCP session gets its own server and session (server.ts), bound to
 * the connection it was initialized with: its hostd and its API key. A request for a session
 * with another key is answered as for an unknown session, so a key never drives another key's
 * sandboxes. A session ends, and its sandboxes go, when its client sends DELETE, when it has
 * been idle (no request open, including the client's GET stream) for `idleTimeoutMs`, or never
 * for `close()` (a server shutting down keeps them: hostd pauses every sandbox then).
 */
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ConnectionOptions } from '../config.js';
import { createMcpServer, type HostdMcpServer } from './server.js';
import type { McpSessionOptions } from './session.js';

export interface McpHttpOptions extends Omit<McpSessionOptions, 'connection'> {
  /** A session with no request open for this long ends; 0 never. Default one hour. */
  idleTimeoutMs?: number;
  /** Sessions open at once; an initialize past it is refused (503). Default 1000. */
  maxSessions?: number;
}

export const DEFAULT_SESSION_IDLE_MS = 3600_000;
const DEFAULT_MAX_SESSIONS = 1000;

interface Entry extends HostdMcpServer {
  id: string;
  transport: StreamableHTTPServerTransport;
  /** SHA-256 of the API key the session was initialized with ('' for none). */
  key: Buffer;
  /** Requests of this session in progress; an open GET stream counts. */
  open: number;
  lastActive: number;
  /** Why it ends; set once. */
  ending?: 'deleted' | 'expired' | 'closed' | 'shutdown';
}

export class McpHttpEndpoint {
  readonly #opts: McpHttpOptions;
  readonly #sessions = new Map<string, Entry>();
  readonly #timer: NodeJS.Timeout | undefined;
  #closed = false;

  constructor(opts: McpHttpOptions = {}) {
    this.#opts = opts;
    const idle = opts.idleTimeoutMs ?? DEFAULT_SESSION_IDLE_MS;
    if (idle > 0) {
      this.#timer = setInterval(() => void this.sweep(), Math.min(idle / 4, 60_000));
      this.#timer.unref();
    }
  }

  /** Sessions open now. */
  get size(): number {
    return this.#sessions.size;
  }

  /**
   * Answers one request to the MCP path: `body` is the parsed JSON body of a POST (the caller's
   * framework read it), `connection` the hostd and key the tools of a new session use; the
   * key must be the one the caller authenticated with.
   */
  async handle(
    req: IncomingMessage,
    res: ServerResponse,
    body: unknown,
    connection: ConnectionOptions,
  ): Promise<void> {
    try {
      await this.#handle(req, res, body, connection);
    } catch (err) {
      this.#opts.log?.('warn', 'MCP request failed', { err: String(err) });
      if (!res.headersSent) rpcError(res, 500, -32603, 'Internal error');
      else res.end();
    }
  }

  async #handle(
    req: IncomingMessage,
    res: ServerResponse,
    body: unknown,
    connection: ConnectionOptions,
  ): Promise<void> {
    if (this.#closed) return rpcError(res, 503, -32000, 'the server is shutting down');
    // A browser page must not drive a local MCP server (DNS rebinding, cross-site requests):
    // MCP clients are programs and send no Origin, browsers on loopback pages excepted.
    const origin = req.headers.origin;
    if (origin !== undefined && !isLoopbackOrigin(origin)) {
      return rpcError(res, 403, -32000, `Invalid Origin header: ${origin}`);
    }
    const key = digest(connection.apiKey ?? '');
    const header = req.headers['mcp-session-id'];
    if (typeof header === 'string') {
      const entry = this.#sessions.get(header);
      if (entry === undefined || !timingSafeEqual(entry.key, key)) {
        return rpcError(res, 404, -32001, 'Session not found');
      }
      return this.#serve(entry, req, res, body);
    }
    if (req.method !== 'POST' || !isInitialize(body)) {
      return rpcError(res, 400, -32000, 'Bad Request: No valid session ID provided');
    }
    const max = this.#opts.maxSessions ?? DEFAULT_MAX_SESSIONS;
    if (this.#sessions.size >= max) {
      return rpcError(
        res,
        503,
        -32000,
        `too many MCP sessions open (${max}): end sessions with DELETE, or wait for idle ones to expire`,
      );
    }
    const made = createMcpServer({ ...this.#opts, connection });
    const entry: Entry = {
      ...made,
      id: '',
      key,
      open: 0,
      lastActive: Date.now(),
      transport: new StreamableHTTPServerTransport({
        sessionIdGenerator: randomUUID,
        onsessioninitialized: (id) => {
          entry.id = id;
          this.#sessions.set(id, entry);
          this.#opts.log?.('info', 'MCP session started', { session: id });
        },
      }),
    };
    // Closed by DELETE (the transport closes itself), expiry, or close().
    made.server.server.onclose = () => void this.#end(entry, 'closed');
    await made.server.connect(entry.transport);
    await this.#serve(entry, req, res, body);
  }

  async #serve(entry: Entry, req: IncomingMessage, res: ServerResponse, body: unknown) {
    entry.open += 1;
    entry.lastActive = Date.now();
    res.once('close', () => {
      entry.open -= 1;
      entry.lastActive = Date.now();
    });
    if (req.method === 'DELETE' && entry.id !== '') {
      // The client ends its session: its sandboxes go before the answer, so that the client
      // (and a test) sees them gone once DELETE returns.
      await this.#end(entry, 'deleted');
    }
    await entry.transport.handleRequest(req, res, body);
  }

  /** Ends the sessions idle for longer than the idle timeout; hostd calls it on a timer. */
  async sweep(now = Date.now()): Promise<void> {
    const idle = this.#opts.idleTimeoutMs ?? DEFAULT_SESSION_IDLE_MS;
    if (idle <= 0) return;
    const expired = [...this.#sessions.values()].filter(
      (e) => e.open === 0 && now - e.lastActive >= idle,
    );
    await Promise.all(
      expired.map(async (entry) => {
        await this.#end(entry, 'expired');
        await entry.transport.close().catch(() => undefined);
      }),
    );
  }

  /**
   * Closes every session without touching its sandboxes: for a server shutting down, whose
   * sandboxes hostd pauses and keeps across the restart (the sessions themselves cannot last).
   */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    const entries = [...this.#sessions.values()];
    for (const entry of entries) entry.ending ??= 'shutdown';
    await Promise.all(entries.map((e) => e.transport.close().catch(() => undefined)));
    this.#sessions.clear();
  }

  /** Ends the session once: forgets it and deletes (or pauses) its sandboxes. */
  async #end(entry: Entry, why: NonNullable<Entry['ending']>): Promise<void> {
    // Already ending for another reason, or closed by a shutdown that keeps the sandboxes.
    if (entry.ending !== undefined) return;
    entry.ending = why;
    this.#sessions.delete(entry.id);
    const report = await entry.session.end();
    this.#opts.log?.('info', 'MCP session ended', {
      session: entry.id,
      why,
      sandboxes: report.action,
      done: report.done.length,
      gone: report.gone.length,
      failed: report.failed.length,
    });
  }
}

function isInitialize(body: unknown): boolean {
  return Array.isArray(body) ? body.some((m) => isInitializeRequest(m)) : isInitializeRequest(body);
}

function digest(key: string): Buffer {
  return createHash('sha256').update(key, 'utf8').digest();
}

function isLoopbackOrigin(origin: string): boolean {
  try {
    const host = new URL(origin).hostname;
    return host === 'localhost' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host);
  } catch {
    return false;
  }
}

/** An answer in MCP's own form (JSON-RPC), as the SDK's transport answers its errors. */
function rpcError(res: ServerResponse, status: number, code: number, message: string): void {
  res
    .writeHead(status, { 'content-type': 'application/json' })
    .end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
}
