/**
 * Where the SDK finds hostd and which key it sends. Explicit options win over the environment:
 * `SERVICE_HOSTD_URL` (default `http://127.0.0.1:7070`) and `SERVICE_API_KEY` (default: no key,
 * which a loopback hostd without keys accepts).
 */

export const DEFAULT_BASE_URL = 'http://127.0.0.1:7070';

/** Options accepted by every call that talks to hostd. */
export interface ConnectionOptions {
  /** Bearer token. Default: `process.env.SERVICE_API_KEY`. An empty string sends no key. */
  apiKey?: string;
  /** Base URL of the HTTP API. Default: `process.env.SERVICE_HOSTD_URL`, else `http://127.0.0.1:7070`. */
  baseUrl?: string;
}

export interface ClientConfig {
  /** Without a trailing slash, so that paths can be appended. */
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
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
  };
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value.trim();
}
