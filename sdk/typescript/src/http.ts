/**
 * The one place that sends API requests: headers (authorization, traceparent, content-type),
 * query strings, retries of 429 and 503, the mapping of error responses onto error classes,
 * and reading bodies.
 */
import type { IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';
import type { ClientConfig } from './config.js';
import { ConnectionError, HostdError, RequestTimeoutError, errorFromResponse } from './errors.js';
import { parseRetryAfter, retryDelayMs, sleep } from './retry.js';
import { traceparent } from './trace.js';
import { describe, exchange } from './transport.js';

/**
 * A raw request body: bytes (sent again on a retry), a function that makes a fresh stream for
 * each attempt (so it can be retried too), or a stream, which can be read only once and so is
 * never retried.
 */
export type BodySource = Uint8Array | (() => Readable) | Readable;

export interface ApiRequest {
  method: string;
  /** From `/v1/...`; the base URL's own path is put in front. */
  path: string;
  /** Encoded like encodeURIComponent; undefined values are left out. */
  query?: Record<string, string | undefined>;
  /** Sent as `application/json`. */
  json?: unknown;
  body?: BodySource;
  /** Of `body`; default `application/octet-stream`. */
  contentType?: string;
  accept?: string;
  signal?: AbortSignal | undefined;
  /** The longest silence while the response body is read; default the request timeout, 0 none. */
  bodyTimeoutMs?: number;
}

/**
 * Sends a request, retrying 429 and 503 answers as config.ts describes, and returns the 2xx
 * response with its body unread (read it or destroy it). Any other status becomes the matching
 * HostdError subclass.
 */
export async function request(config: ClientConfig, req: ApiRequest): Promise<IncomingMessage> {
  const url = new URL(`${config.baseUrl}${req.path}${queryString(req.query)}`);
  const headers: OutgoingHttpHeaders = {
    accept: req.accept ?? 'application/json',
    traceparent: await traceparent(),
  };
  if (config.apiKey !== undefined) headers.authorization = `Bearer ${config.apiKey}`;
  let bytes: Uint8Array | undefined;
  if (req.json !== undefined) {
    headers['content-type'] = 'application/json';
    bytes = Buffer.from(JSON.stringify(req.json));
  } else if (req.body !== undefined) {
    headers['content-type'] = req.contentType ?? 'application/octet-stream';
    if (req.body instanceof Uint8Array) bytes = req.body;
  }
  if (bytes !== undefined) headers['content-length'] = bytes.byteLength;
  const replayable = typeof req.body !== 'object' || req.body instanceof Uint8Array;
  for (let attempt = 0; ; attempt++) {
    const body = typeof req.body === 'function' ? req.body() : (bytes ?? req.body);
    const { res, setIdleTimeout } = await exchange({
      url,
      method: req.method,
      headers,
      body,
      signal: req.signal,
      timeoutMs: config.requestTimeoutMs,
      baseUrl: config.baseUrl,
    });
    const status = res.statusCode ?? 0;
    if (status >= 200 && status < 300) {
      setIdleTimeout(req.bodyTimeoutMs ?? config.requestTimeoutMs);
      return res;
    }
    const err = await errorOf(res, req.signal);
    const delay = replayable
      ? retryDelayMs(status, err.retryAfterMs, attempt, config.maxRetries)
      : undefined;
    if (delay === undefined) throw err;
    await sleep(delay, req.signal);
  }
}

/** `request`, then the JSON body. */
export async function requestJson<T>(config: ClientConfig, req: ApiRequest): Promise<T> {
  const res = await request(config, req);
  const text = (await readAll(res, req.signal)).toString('utf8');
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new HostdError(`hostd sent a response that is not JSON: ${clip(text)}`, {
      status: res.statusCode,
    });
  }
}

/** `request`, then the whole body as text (empty for 204). */
export async function requestText(config: ClientConfig, req: ApiRequest): Promise<string> {
  return (await readAll(await request(config, req), req.signal)).toString('utf8');
}

/** Path of a sandbox route; ids are `sbx_` + hex, but nothing odd should reach the URL. */
export function sandboxPath(id: string, suffix = ''): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
}

/**
 * The whole body. A failure while reading is the signal's reason, RequestTimeoutError, or
 * ConnectionError.
 */
export async function readAll(res: IncomingMessage, signal?: AbortSignal): Promise<Buffer> {
  const chunks: Buffer[] = [];
  try {
    for await (const chunk of res) chunks.push(chunk as Buffer);
  } catch (err) {
    throw streamError(err, signal);
  }
  return Buffer.concat(chunks);
}

/** What a failure while reading a response body becomes. */
export function streamError(err: unknown, signal?: AbortSignal): unknown {
  if (signal?.aborted) return signal.reason;
  if (err instanceof RequestTimeoutError) return err;
  return new ConnectionError(`the connection to hostd broke: ${describe(err)}`, { cause: err });
}

function queryString(query: Record<string, string | undefined> | undefined): string {
  const pairs = Object.entries(query ?? {}).filter(
    (e): e is [string, string] => e[1] !== undefined,
  );
  if (pairs.length === 0) return '';
  return `?${pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('&')}`;
}

/** The error a non-2xx response stands for: the server's `{"error", "code"}` when it sent one. */
async function errorOf(res: IncomingMessage, signal: AbortSignal | undefined): Promise<HostdError> {
  const status = res.statusCode ?? 0;
  let text = '';
  try {
    text = (await readAll(res, signal)).toString('utf8');
  } catch {
    if (signal?.aborted) throw signal.reason;
  }
  let message: string | undefined;
  let code: string | undefined;
  try {
    const parsed = JSON.parse(text) as { error?: unknown; code?: unknown };
    if (typeof parsed.error === 'string' && parsed.error !== '') message = parsed.error;
    if (typeof parsed.code === 'string' && parsed.code !== '') code = parsed.code;
  } catch {
    // Not JSON: a proxy's HTML page, say.
  }
  if (message === undefined) {
    const trimmed = text.trim();
    message = trimmed === '' ? `HTTP ${status} ${res.statusMessage ?? ''}`.trim() : clip(trimmed);
  }
  const retryAfter = res.headers['retry-after'];
  return errorFromResponse({
    status,
    code,
    message,
    retryAfterMs: parseRetryAfter(Array.isArray(retryAfter) ? retryAfter[0] : retryAfter),
  });
}

function clip(text: string): string {
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
