/**
 * The one place that sends requests: headers (authorization, traceparent, content-type), the
 * mapping of failures onto error classes, and JSON decoding.
 */
import type { ClientConfig } from './config.js';
import { ConnectionError, HostdError, errorForStatus } from './errors.js';
import { traceparent } from './trace.js';

export interface RequestOptions {
  /** Serialized as JSON; no body (and no content-type) when undefined. */
  body?: unknown;
  signal?: AbortSignal | undefined;
  accept?: string;
}

/**
 * Sends a request and returns the 2xx response with its body unread; any other status becomes
 * the matching HostdError subclass.
 */
export async function request(
  config: ClientConfig,
  method: string,
  path: string,
  opts: RequestOptions = {},
): Promise<Response> {
  const headers: Record<string, string> = {
    accept: opts.accept ?? 'application/json',
    traceparent: await traceparent(),
  };
  if (config.apiKey !== undefined) headers.authorization = `Bearer ${config.apiKey}`;
  let body: string | undefined;
  if (opts.body !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.body);
  }
  const url = `${config.baseUrl}${path}`;
  let res: Response;
  try {
    res = await fetch(url, { method, headers, body, signal: opts.signal });
  } catch (err) {
    if (opts.signal?.aborted) throw opts.signal.reason;
    throw new ConnectionError(
      `cannot reach hostd at ${config.baseUrl}: ${describeFetchError(err)}`,
      {
        cause: err,
      },
    );
  }
  if (res.ok) return res;
  throw errorForStatus(res.status, await errorMessage(res, opts.signal));
}

/** `request` and then the JSON body. */
export async function requestJson<T>(
  config: ClientConfig,
  method: string,
  path: string,
  opts: RequestOptions = {},
): Promise<T> {
  const res = await request(config, method, path, opts);
  const text = await readText(res, opts.signal);
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new HostdError(`hostd sent a response that is not JSON: ${clip(text)}`, {
      status: res.status,
    });
  }
}

/** `request` and then the whole body as text (empty for 204). */
export async function requestText(
  config: ClientConfig,
  method: string,
  path: string,
  opts: RequestOptions = {},
): Promise<string> {
  const res = await request(config, method, path, opts);
  return readText(res, opts.signal);
}

/** Path segment for a sandbox id; ids are `sbx_` + hex, but nothing odd should reach the URL. */
export function sandboxPath(id: string, suffix = ''): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
}

async function readText(res: Response, signal: AbortSignal | undefined): Promise<string> {
  try {
    return await res.text();
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw new ConnectionError(`the connection to hostd broke: ${describeFetchError(err)}`, {
      cause: err,
    });
  }
}

/** The server's `{"error": message}`, or whatever text it sent, or the status line. */
async function errorMessage(res: Response, signal: AbortSignal | undefined): Promise<string> {
  let text = '';
  try {
    text = await res.text();
  } catch {
    if (signal?.aborted) throw signal.reason;
  }
  try {
    const parsed = JSON.parse(text) as { error?: unknown };
    if (typeof parsed.error === 'string' && parsed.error !== '') return parsed.error;
  } catch {
    // Not JSON: a proxy's HTML page, say.
  }
  const trimmed = text.trim();
  return trimmed === '' ? `HTTP ${res.status} ${res.statusText}`.trim() : clip(trimmed);
}

/** undici hides the useful part (ECONNREFUSED, ENOTFOUND) in `cause`. */
export function describeFetchError(err: unknown): string {
  const cause = (err as { cause?: { code?: unknown; message?: unknown } } | undefined)?.cause;
  if (cause && typeof cause.code === 'string') return cause.code;
  if (cause && typeof cause.message === 'string') return cause.message;
  return err instanceof Error ? err.message : String(err);
}

function clip(text: string): string {
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
