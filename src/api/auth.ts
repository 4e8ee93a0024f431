/**
 * Bearer-key authentication as docs/api.md (Authentication) specifies. Keys are compared through
 * their SHA-256 digests with timingSafeEqual, against every configured key without an early
 * exit, so neither the key length nor which key matched shows in the response time.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { fail, type HostdError } from '../errors.js';

export type AuthMode =
  | { kind: 'keys'; keys: readonly string[] }
  | { kind: 'open'; why: 'loopback-no-keys' | 'disabled' };

/**
 * Decides the auth mode at start-up. Throws for a non-loopback bind with no keys and no
 * explicit disable: an open sandbox service on a network is remote code execution for anyone.
 */
export function authMode(opts: {
  apiKeys: readonly string[];
  authDisabled: boolean;
  loopback: boolean;
}): AuthMode {
  if (opts.authDisabled) return { kind: 'open', why: 'disabled' };
  if (opts.apiKeys.length > 0) return { kind: 'keys', keys: opts.apiKeys };
  if (opts.loopback) return { kind: 'open', why: 'loopback-no-keys' };
  throw new Error(
    'refusing to start: SERVICE_HOSTD_ADDR is not a loopback address and no SERVICE_API_KEYS are set. ' +
      'Set SERVICE_API_KEYS=<key>[,<key>...] (or SERVICE_AUTH_DISABLED=1 to run open, which lets anyone on the network run code).',
  );
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** The key of an `Authorization: Bearer <key>` header; undefined for anything else. */
export function bearerToken(header: string | undefined): string | undefined {
  return header === undefined ? undefined : /^Bearer[ ]+(\S+)\s*$/i.exec(header)?.[1];
}

/**
 * Returns a matcher: true when `key` is one of the configured keys (any key, and no key, when
 * auth is open). Shared by the native bearer check and the E2B front's `X-API-KEY`, so the two
 * accept exactly the same keys the same way.
 */
export function makeKeyMatcher(mode: AuthMode): (key: string | undefined) => boolean {
  if (mode.kind === 'open') return () => true;
  const digests = mode.keys.map(digest);
  return (key) => {
    if (key === undefined) return false;
    const presented = digest(key);
    let ok = false;
    for (const d of digests) ok = timingSafeEqual(d, presented) || ok;
    return ok;
  };
}

/** Returns a checker: given the Authorization header, null when allowed, else the 401 error. */
export function makeAuthChecker(mode: AuthMode): (header: string | undefined) => HostdError | null {
  if (mode.kind === 'open') return () => null;
  const matches = makeKeyMatcher(mode);
  return (header) => {
    const token = bearerToken(header);
    if (token === undefined) return fail('missingApiKey');
    return matches(token) ? null : fail('invalidApiKey');
  };
}
