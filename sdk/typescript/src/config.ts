/**
 * Where the SDK finds hostd, which key it sends, how long it waits and how often it retries.
 * Explicit options win over the environment:
 *
 * | Variable                    | Option             | Default                         |
 * |-----------------------------|--------------------|---------------------------------|
 * | `SERVICE_HOSTD_URL`         | `baseUrl`          | `http://127.0.0.1:7070`         |
 * | `SERVICE_API_KEY`           | `apiKey`           | none (no `Authorization` header) |
 * | `SERVICE_REQUEST_TIMEOUT_S` | `requestTimeoutMs` | 60 s; `0` waits forever         |
 * | `SERVICE_MAX_RETRIES`       | `maxRetries`       | 3; `0` never retries            |
 */

export const DEFAULT_BASE_URL = 'http://127.0.0.1:7070';
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
export const DEFAULT_MAX_RETRIES = 3;

/** Options accepted by every call that talks to hostd. */
export interface ConnectionOptions {
  /** Bearer token. Default: `process.env.SERVICE_API_KEY`. An empty string sends no key. */
  apiKey?: string;
  /** Base URL of the HTTP API. Default: `process.env.SERVICE_HOSTD_URL`, else `http://127.0.0.1:7070`. */
  baseUrl?: string;
  /**
   * The longest hostd may stay silent: before its answer, and between two pieces of a body.
   * A request that waits its turn behind a long exec on the same sandbox (a fork, a second
   * exec) is silent meanwhile, so raise this for those. An exec stream waits its own `timeoutMs`
   * plus this once it runs, and forever when it has no `timeoutMs`. Default:
   * `SERVICE_REQUEST_TIMEOUT_S` (seconds), else 60 000 ms; `0` waits forever.
   */
  requestTimeoutMs?: number;
  /**
   * How many times a request answered `429` or `503` is sent again (after the server's
   * `Retry-After`, else 0.5 s, 1 s, 2 s, ...). Nothing else is retried, and a `Retry-After` over
   * 30 s is not waited for. Default: `SERVICE_MAX_RETRIES`, else 3; `0` never retries.
   */
  maxRetries?: number;
}

/** Options of every call: aborting the signal aborts the request (and rejects with its reason). */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface ClientConfig {
  /** Without a trailing slash, so that paths can be appended. */
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  /** 0: no timeout. */
  readonly requestTimeoutMs: number;
  readonly maxRetries: number;
}

/** Resolves options against the environment; `env` is a parameter for tests. */
export function resolveConfig(
  opts: ConnectionOptions = {},
  env: Record<string, string | undefined> = process.env,
): ClientConfig {
  const rawUrl = opts.baseUrl ?? nonEmpty(env.SERVICE_HOSTD_URL) ?? DEFAULT_BASE_URL;
  let url: URL;
  try {
    url = new URL(rawUrl);
  } catch {
    throw new TypeError(`hostd base URL is not a valid URL: ${JSON.stringify(rawUrl)}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new TypeError(`hostd base URL must be http or https, got ${JSON.stringify(rawUrl)}`);
  }
  const apiKey = opts.apiKey ?? nonEmpty(env.SERVICE_API_KEY);
  return {
    baseUrl: `${url.origin}${url.pathname}`.replace(/\/+$/, ''),
    apiKey: apiKey === '' ? undefined : apiKey,
    requestTimeoutMs:
      opts.requestTimeoutMs === undefined
        ? fromEnv(env, 'SERVICE_REQUEST_TIMEOUT_S', 1000, DEFAULT_REQUEST_TIMEOUT_MS)
        : checked('requestTimeoutMs', opts.requestTimeoutMs, false),
    maxRetries:
      opts.maxRetries === undefined
        ? fromEnv(env, 'SERVICE_MAX_RETRIES', 1, DEFAULT_MAX_RETRIES)
        : checked('maxRetries', opts.maxRetries, true),
  };
}

/** A variable's number times `scale`, or `fallback` when unset; a TypeError when malformed. */
function fromEnv(
  env: Record<string, string | undefined>,
  name: string,
  scale: number,
  fallback: number,
): number {
  const raw = nonEmpty(env[name]);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  const whole = scale === 1;
  if (Number.isFinite(value) && value >= 0 && (!whole || Number.isInteger(value))) {
    return value * scale;
  }
  throw new TypeError(`${name} must be ${whole ? 'a whole number' : 'a number'} >= 0, got ${raw}`);
}

function checked(name: string, value: number, whole: boolean): number {
  if (Number.isFinite(value) && value >= 0 && (!whole || Number.isInteger(value))) return value;
  throw new TypeError(
    `${name} must be ${whole ? 'a whole number' : 'a number'} >= 0, got ${value}`,
  );
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value.trim();
}
