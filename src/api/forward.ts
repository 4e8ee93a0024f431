/**
 * One hop of cluster mode: a request for a sandbox that another node holds is passed to that
 * node as it came (method, path, query, headers: the client's Authorization and `traceparent`
 * included) and the answer passed back as it comes (status, headers, body: error bodies, exec
 * NDJSON events as they are written, file transfers of any size). Bodies stream both ways with
 * backpressure; nothing is buffered but what a create needs to be asked of another node.
 *
 * The forwarded request carries `X-Hostd-Forwarded-By: <node>`: a node serves such a request
 * itself or answers it, and never forwards it again, so a request crosses at most one hop even
 * while two nodes' views of the catalog disagree.
 */
import {
  Agent,
  request as httpRequest,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import { HOP_HEADER } from '../core/cluster/headers.js';
import { fail, type HostdError } from '../errors.js';

/** Headers of one connection, not of the request (RFC 9110, 7.6.1), and what we rewrite. */
const NOT_FORWARDED = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
]);

export interface Target {
  readonly id: string;
  readonly url: string;
}

/** A buffered answer of another node (a create asked there, one page of a list). */
export interface Answer {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: Buffer;
}

export class Forwarder {
  /** One keep-alive pool per node: a forwarded exec costs no new connection. */
  private readonly agents = new Map<string, Agent>();

  constructor(private readonly self: string) {}

  /**
   * Passes `req` to `target` and its answer back on `res`, streaming both ways. A node that does
   * not answer gets the client a 503 node_unavailable (Retry-After: 1) when nothing was sent yet;
   * past that, the client's connection is closed as the node's was. `failed` writes that error in
   * the shape the client reads (the E2B front's differs from the native API's).
   */
  pass(
    req: IncomingMessage,
    res: ServerResponse,
    target: Target,
    failed: (res: ServerResponse, err: HostdError) => void = writeError,
  ): Promise<void> {
    return new Promise((resolve) => {
      const url = new URL(req.url ?? '/', target.url);
      const upstream = httpRequest(url, {
        method: req.method,
        headers: this.headersFor(req, url),
        agent: this.agent(target),
      });
      let answered = false;
      const finish = (): void => resolve();
      upstream.on('response', (up) => {
        answered = true;
        res.writeHead(up.statusCode ?? 502, passHeaders(up.headers));
        res.flushHeaders();
        res.socket?.setNoDelay(true);
        up.pipe(res);
        up.on('error', () => res.destroy());
        up.on('aborted', () => res.destroy());
        res.on('close', finish);
      });
      upstream.on('error', (err) => {
        if (!answered && !res.headersSent) {
          failed(res, fail('nodeUnreachable', target.id, err.message));
        } else {
          res.destroy();
        }
        finish();
      });
      // The client went away: so does the request to the node (an exec is interrupted there).
      res.on('close', () => {
        if (!res.writableFinished) upstream.destroy();
      });
      req.pipe(upstream);
    });
  }

  /** Asks `target` and buffers its answer (small JSON bodies only: creates, list pages). */
  ask(
    req: { method: string; url: string; headers: IncomingMessage['headers'] },
    target: Target,
    body?: Buffer,
    timeoutMs = 120_000,
  ): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const url = new URL(req.url, target.url);
      const headers = this.headersFor(req, url);
      if (body !== undefined) {
        headers['content-length'] = String(body.length);
        headers['content-type'] = 'application/json';
      } else {
        delete headers['content-length'];
        delete headers['content-type'];
      }
      const upstream = httpRequest(url, {
        method: req.method,
        headers,
        agent: this.agent(target),
        timeout: timeoutMs,
      });
      upstream.on('response', (up) => {
        const chunks: Buffer[] = [];
        up.on('data', (c: Buffer) => chunks.push(c));
        up.on('end', () =>
          resolve({
            status: up.statusCode ?? 502,
            headers: up.headers,
            body: Buffer.concat(chunks),
          }),
        );
        up.on('error', reject);
      });
      upstream.on('timeout', () => upstream.destroy(new Error(`no answer in ${timeoutMs} ms`)));
      upstream.on('error', (err) => reject(fail('nodeUnreachable', target.id, err.message)));
      upstream.end(body);
    });
  }

  close(): void {
    for (const a of this.agents.values()) a.destroy();
    this.agents.clear();
  }

  private agent(target: Target): Agent {
    let agent = this.agents.get(target.url);
    if (!agent) {
      agent = new Agent({ keepAlive: true, maxSockets: 256 });
      this.agents.set(target.url, agent);
    }
    return agent;
  }

  private headersFor(
    req: { headers: IncomingMessage['headers']; socket?: IncomingMessage['socket'] },
    url: URL,
  ): Record<string, string | string[]> {
    const out: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(req.headers)) {
      if (value !== undefined && !NOT_FORWARDED.has(name)) out[name] = value;
    }
    out.host = url.host;
    out[HOP_HEADER] = this.self;
    const from = req.socket?.remoteAddress;
    if (from) {
      const before = req.headers['x-forwarded-for'];
      out['x-forwarded-for'] = before ? `${String(before)}, ${from}` : from;
    }
    return out;
  }
}

/** The node's answer headers, less those of its connection. */
function passHeaders(headers: IncomingMessage['headers']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !NOT_FORWARDED.has(name)) out[name] = value;
  }
  return out;
}

/** `{"error", "code"}` with the entry's status, on a raw response (a hijacked reply). */
export function writeError(res: ServerResponse, err: HostdError): void {
  const body = JSON.stringify(err.toBody());
  const headers: Record<string, string> = {
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(body)),
  };
  if (err.retryAfterS !== undefined) headers['retry-after'] = String(err.retryAfterS);
  res.writeHead(err.status, headers);
  res.end(body);
}
