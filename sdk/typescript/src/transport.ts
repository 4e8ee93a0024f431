/**
 * One HTTP exchange over node:http. Not fetch: Node's fetch (undici) abandons a response whose
 * headers take over 300 s or whose body is silent for 300 s, and only the undici package can
 * change that. An exec legitimately stays silent for longer, and a request can wait its turn
 * behind a long exec, so the SDK sets those limits itself (config.ts explains them).
 */
import {
  Agent as HttpAgent,
  request as httpRequest,
  type ClientRequest,
  type IncomingMessage,
  type OutgoingHttpHeaders,
} from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Readable } from 'node:stream';
import { ConnectionError, RequestTimeoutError } from './errors.js';

// Keep-alive as Node 20's global agent does it, for Node 18 too; idle sockets close after 5 s,
// before hostd closes them, so that a request never lands on a socket the server is closing.
const agents = {
  'http:': new HttpAgent({ keepAlive: true, timeout: 5_000 }),
  'https:': new HttpsAgent({ keepAlive: true, timeout: 5_000 }),
};

export interface Exchange {
  url: URL;
  method: string;
  headers: OutgoingHttpHeaders;
  /** Bytes are sent with a content-length; a stream is piped (chunked) and consumed. */
  body?: Uint8Array | Readable | undefined;
  signal?: AbortSignal | undefined;
  /** The longest silence before the response headers; 0 for none. */
  timeoutMs: number;
  /** The base URL, for messages. */
  baseUrl: string;
}

/** A response whose headers arrived; its body is for the caller to read or destroy. */
export interface Answer {
  res: IncomingMessage;
  /** The longest silence allowed from now on while the body is read; 0 for none. */
  setIdleTimeout(ms: number): void;
}

/**
 * Sends a request and resolves when the response headers arrive, whatever the status. Rejects
 * with ConnectionError (no response), RequestTimeoutError, the signal's reason, or the error
 * of a body stream that failed. Later, the body stream fails the same ways.
 */
export function exchange(x: Exchange): Promise<Answer> {
  return new Promise((resolve, reject) => {
    if (x.signal?.aborted) return reject(x.signal.reason);
    const send = x.url.protocol === 'https:' ? httpsRequest : httpRequest;
    let limitMs = x.timeoutMs;
    let res: IncomingMessage | undefined;
    let bodyError: unknown;
    let req: ClientRequest;
    const onAbort = (): void => void (res ?? req).destroy(x.signal?.reason);
    const settle = (): void => x.signal?.removeEventListener('abort', onAbort);
    try {
      req = send(x.url, {
        method: x.method,
        headers: x.headers,
        agent: agents[x.url.protocol as keyof typeof agents],
      });
    } catch (err) {
      return reject(new ConnectionError(`cannot send to hostd at ${x.baseUrl}: ${describe(err)}`));
    }
    x.signal?.addEventListener('abort', onAbort, { once: true });
    req.setTimeout(limitMs);
    req.on('timeout', () => {
      const where = res ? 'in the middle of its answer' : 'before answering';
      const err = new RequestTimeoutError(
        `hostd at ${x.baseUrl} sent nothing for ${limitMs} ms ${where} (requestTimeoutMs)`,
      );
      (res ?? req).destroy(err);
    });
    req.on('error', (err) => {
      if (res) return; // the response stream reports its own failure
      settle();
      if (x.signal?.aborted) reject(x.signal.reason);
      else if (bodyError !== undefined) reject(bodyError);
      else if (err instanceof RequestTimeoutError) reject(err);
      else reject(new ConnectionError(`cannot reach hostd at ${x.baseUrl}: ${describe(err)}`));
    });
    req.on('response', (response) => {
      res = response;
      response.once('close', settle);
      // An early answer (an error before the upload was read) ends the upload.
      if (isStream(x.body) && !x.body.readableEnded) x.body.unpipe(req).destroy();
      resolve({
        res: response,
        setIdleTimeout(ms) {
          limitMs = ms;
          req.setTimeout(ms);
        },
      });
    });
    if (isStream(x.body)) {
      x.body.once('error', (err) => {
        bodyError = err;
        req.destroy(err);
      });
      x.body.pipe(req);
    } else {
      req.end(x.body);
    }
  });
}

function isStream(body: Uint8Array | Readable | undefined): body is Readable {
  return body !== undefined && !(body instanceof Uint8Array);
}

/** Node hides the useful part (ECONNREFUSED, ENOTFOUND) in `code`. */
export function describe(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown } | undefined;
  if (e && typeof e.code === 'string') return e.code;
  if (e && typeof e.message === 'string') return e.message;
  return String(err);
}
