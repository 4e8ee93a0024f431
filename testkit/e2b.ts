/**
 * Testing the E2B front (docs/e2b.md) through E2B's own published SDKs: point them at a hostd
 * with nothing but E2B's environment variables, track the sandboxes a test makes (reported on
 * failure with their VM log tail, always deleted through the native API), and speak the raw
 * protocol where the JS SDK does not reach.
 */
import { reportFailure } from './sandboxes.js';
import type { Hostd } from './hostd.js';

/** A key in the format older E2B SDKs check (`e2b_` and lowercase hex). */
export const E2B_TEST_KEY = `e2b_${'0123456789abcdef'.repeat(2)}01234567`;

/**
 * Points the E2B SDKs of this process at `hostd`: `E2B_API_URL` and `E2B_SANDBOX_URL` are the
 * front's origin, `E2B_API_KEY` the key. E2B_DEBUG is removed (it makes the SDKs skip the API).
 */
export function pointE2bAt(hostd: Hostd, apiKey = E2B_TEST_KEY): void {
  if (!hostd.e2bUrl) throw new Error('this hostd serves no E2B front (SERVICE_E2B_ADDR=off?)');
  process.env.E2B_API_URL = hostd.e2bUrl;
  process.env.E2B_SANDBOX_URL = hostd.e2bUrl;
  process.env.E2B_API_KEY = apiKey;
  delete process.env.E2B_DEBUG;
}

/** The sandboxes of one test, by E2B's `sandboxId` (hostd's id). */
export interface E2bScope {
  track<T extends { sandboxId: string } | string>(sandbox: T): T;
}

/**
 * Runs `fn`; on failure prints each tracked sandbox's id and VM log tail with hostd's log tail;
 * always deletes them (natively: a test of kill may have killed them already).
 */
export async function withE2b(hostd: Hostd, fn: (scope: E2bScope) => Promise<void>): Promise<void> {
  const made: string[] = [];
  const scope: E2bScope = {
    track(sandbox) {
      made.push(typeof sandbox === 'string' ? sandbox : sandbox.sandboxId);
      return sandbox;
    },
  };
  try {
    await fn(scope);
  } catch (err) {
    for (const id of made) await reportFailure(hostd, id);
    throw err;
  } finally {
    await Promise.all(
      made.map((id) => hostd.request('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined)),
    );
  }
}

/**
 * The headers of sandbox traffic (docs/e2b.md): which sandbox, which of its services (envd's
 * 49983 unless told), and its access token.
 */
export function sandboxHeaders(
  sandboxId: string,
  accessToken: string,
  port = 49983,
): Record<string, string> {
  return {
    'e2b-sandbox-id': sandboxId,
    'e2b-sandbox-port': String(port),
    'x-access-token': accessToken,
  };
}

/** A raw request to the E2B front, with E2B's headers (`X-API-KEY`, sandbox headers) as given. */
export async function e2bRequest(
  hostd: Hostd,
  method: string,
  path: string,
  opts: { body?: unknown; headers?: Record<string, string>; apiKey?: string | null } = {},
): Promise<{ status: number; headers: Headers; text: string; json: unknown }> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.apiKey !== null) headers['x-api-key'] = opts.apiKey ?? E2B_TEST_KEY;
  if (opts.body !== undefined) headers['content-type'] ??= 'application/json';
  const res = await fetch(hostd.e2bUrl + path, {
    method,
    headers,
    body:
      opts.body === undefined || typeof opts.body === 'string'
        ? (opts.body as string | undefined)
        : JSON.stringify(opts.body),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}
