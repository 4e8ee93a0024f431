/**
 * A scripted stand-in for hostd on 127.0.0.1:0, for testing pure client logic (status mapping,
 * headers, stream parsing) without VMs. It records every request it gets.
 */
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';

export interface RecordedRequest {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  /** The body as UTF-8 text. */
  body: string;
  /** The body's bytes (uploads). */
  bytes: Buffer;
}

export type Handler = (
  req: RecordedRequest,
  res: ServerResponse,
  raw: IncomingMessage,
) => void | Promise<void>;

export interface FakeHostd {
  url: string;
  requests: RecordedRequest[];
  /** Replace the handler for the next requests. */
  handle(handler: Handler): void;
  close(): Promise<void>;
}

/**
 * Responds with `{"error": message}` (and `code` when given, as hostd does; without it, like a
 * server or proxy that sends none) and the given status.
 */
export function sendError(
  res: ServerResponse,
  status: number,
  message: string,
  code?: string,
  headers: Record<string, string> = {},
): void {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(code === undefined ? { error: message } : { error: message, code }));
}

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** An exec event line as hostd writes it. */
export function eventLine(
  type: string,
  data: unknown,
  seq: number,
  extra: Record<string, unknown> = {},
): string {
  return `${JSON.stringify({ type, data, seq, ts: Date.now(), ...extra })}\n`;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A promise and its resolve, for a fake and its client to wait on each other. */
export function signal(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * True once `promise` settles, false if it has not after `ms`: a fake waiting for its client
 * must not hang when the client is wrong.
 */
export function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.then(() => true),
    new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms))),
  ]).finally(() => clearTimeout(timer));
}

/** A default that answers the basic routes like hostd would. */
export const defaultHandler: Handler = (req, res) => {
  if (req.method === 'POST' && req.url === '/v1/sandboxes') {
    return sendJson(res, 200, { id: 'sbx_' + 'a'.repeat(32), state: 'ready' });
  }
  const m = /^\/v1\/sandboxes\/(sbx_[0-9a-f]{32})$/.exec(req.url);
  if (req.method === 'GET' && m) {
    return sendJson(res, 200, {
      id: m[1],
      state: 'ready',
      template: 'python',
      created_at: '2026-01-01T00:00:00.000Z',
      last_used_at: '2026-01-01T00:00:00.000Z',
      parent_id: null,
      busy: false,
      queued: 0,
    });
  }
  sendError(res, 404, `no route for ${req.method} ${req.url}`, 'route_not_found');
};

export async function startFakeHostd(handler: Handler = defaultHandler): Promise<FakeHostd> {
  let current = handler;
  const requests: RecordedRequest[] = [];
  const sockets = new Set<import('node:net').Socket>();
  const server = createServer((raw, res) => {
    const chunks: Buffer[] = [];
    raw.on('data', (c: Buffer) => chunks.push(c));
    raw.on('end', () => {
      const bytes = Buffer.concat(chunks);
      const req: RecordedRequest = {
        method: raw.method ?? '',
        url: raw.url ?? '',
        headers: raw.headers,
        body: bytes.toString('utf8'),
        bytes,
      };
      requests.push(req);
      Promise.resolve(current(req, res, raw)).catch((err: unknown) => {
        if (!res.headersSent) sendError(res, 500, `fake failed: ${String(err)}`);
        else res.destroy();
      });
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    handle(next) {
      current = next;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
