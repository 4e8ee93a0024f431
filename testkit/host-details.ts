/**
 * The check behind "messages carry no host paths" (src/errors.ts): every error answer a test
 * reads through testkit (a non-2xx body, an exec's `exit` error and hostd's own stderr lines, a
 * sandbox's or template's `error` field) and every answer of the inject-based unit tests is
 * scanned for hostd's directories and the usual places of host files, and the test that got one
 * fails with what leaked. The raw text belongs in hostd's log, with the sandbox id.
 */
import { ROOT } from './root.js';

/** Where host files live; a guest path the client named is taken out before the scan. */
const HOST_PLACES =
  /(?:\/dev\/shm|\/var\/(?:lib|cache|tmp|run|log)|\/tmp\/hostd|\/run|\/root|\/home|\/proc\/\d+)\/[^\s"'`,;)]*/g;

/**
 * The host details in `text`: hostd's own directories (`hostDirs`: its state, data and cache
 * directories), this checkout (a stack trace) and paths under the usual host places. `allowed`
 * are strings the client itself sent (a guest path in the request), which an answer may quote.
 */
export function hostDetailsIn(
  text: string,
  hostDirs: readonly string[],
  allowed: readonly string[] = [],
): string[] {
  let scanned = text;
  for (const a of allowed) if (a.length > 1) scanned = scanned.split(a).join('<client value>');
  const found: string[] = [];
  for (const dir of [...hostDirs, ROOT]) if (dir && scanned.includes(dir)) found.push(dir);
  for (const m of scanned.matchAll(HOST_PLACES)) found.push(m[0]);
  return found;
}

/** Throws, naming what leaked, when `text` (from `where`) holds a host detail. */
export function assertNoHostDetails(
  where: string,
  text: string,
  hostDirs: readonly string[],
  allowed: readonly string[] = [],
): void {
  const found = hostDetailsIn(text, hostDirs, allowed);
  if (found.length > 0) {
    throw new Error(
      `${where} shows host details to the client (${found.join(', ')}): ${text.slice(0, 500)}`,
    );
  }
}

/** Every string under a key named `error` in a JSON value: what hostd tells clients went wrong. */
export function errorTexts(value: unknown): string[] {
  const out: string[] = [];
  const walk = (v: unknown, depth: number): void => {
    if (depth > 8 || v === null || typeof v !== 'object') return;
    for (const [k, item] of Object.entries(v)) {
      if (k === 'error' && typeof item === 'string') out.push(item);
      else walk(item, depth + 1);
    }
  };
  walk(value, 0);
  return out;
}

/** The guest paths a request names (its `path` query parameter), which its answer may quote. */
export function clientValues(path: string): string[] {
  const q = path.indexOf('?');
  if (q < 0) return [];
  return new URLSearchParams(path.slice(q + 1)).getAll('path');
}
