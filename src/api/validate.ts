/**
 * Request body validation. Hand-written rather than JSON Schema so that every rejection has a
 * message a person can act on ("n must be an integer from 1 to 32, got 33") and the handlers get
 * typed values. Unknown fields are rejected: a typo such as `timeout_ms` should not be ignored.
 */
import { fail } from '../errors.js';
import { MAX_FORK, type Language } from '../core/sandbox-manager.js';

type Body = Record<string, unknown>;

function objectBody(body: unknown, allowMissing: boolean): Body {
  if (body === undefined || body === null) {
    if (allowMissing) return {};
    throw fail('bodyNotObject', 'the body (required)');
  }
  if (typeof body !== 'object' || Array.isArray(body)) {
    throw fail('bodyNotObject', 'the body');
  }
  return body as Body;
}

function onlyFields(body: Body, allowed: readonly string[]): void {
  for (const key of Object.keys(body)) {
    if (!allowed.includes(key)) {
      throw fail('unknownField', key, allowed);
    }
  }
}

/** An optional non-empty string field. */
function optionalName(b: Body, field: string): string | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string' || v === '') throw fail('invalidField', field, 'a non-empty string', v);
  return v;
}

export function parseCreate(body: unknown): { template?: string; snapshot?: string } {
  const b = objectBody(body, true);
  onlyFields(b, ['template', 'snapshot']);
  const template = optionalName(b, 'template');
  const snapshot = optionalName(b, 'snapshot');
  if (template !== undefined && snapshot !== undefined) {
    throw fail('conflictingFields', 'template', 'snapshot');
  }
  return {
    ...(template === undefined ? {} : { template }),
    ...(snapshot === undefined ? {} : { snapshot }),
  };
}

/** Routes that take no body: anything sent is a mistake worth a 400. */
export function parseNoBody(body: unknown, op: string): void {
  if (body !== undefined) throw fail('bodyNotAllowed', op);
}

/** Longest accepted exec timeout: a day. */
export const MAX_TIMEOUT_S = 86_400;

export function parseExec(body: unknown): { code: string; language: Language; timeoutMs?: number } {
  const b = objectBody(body, false);
  onlyFields(b, ['code', 'language', 'timeout']);
  if (typeof b.code !== 'string') {
    throw fail('invalidField', 'code', 'a string (required)', b.code);
  }
  const language = b.language ?? 'python';
  if (language !== 'python' && language !== 'bash') {
    throw fail('invalidField', 'language', '"python" or "bash"', language);
  }
  if (b.timeout === undefined || b.timeout === null) return { code: b.code, language };
  if (
    typeof b.timeout !== 'number' ||
    !Number.isFinite(b.timeout) ||
    b.timeout <= 0 ||
    b.timeout > MAX_TIMEOUT_S
  ) {
    throw fail(
      'invalidField',
      'timeout',
      `a number of seconds in (0, ${MAX_TIMEOUT_S}]`,
      b.timeout,
    );
  }
  return { code: b.code, language, timeoutMs: Math.ceil(b.timeout * 1000) };
}

export function parseFork(body: unknown): { n: number } {
  const b = objectBody(body, false);
  onlyFields(b, ['n']);
  if (typeof b.n !== 'number' || !Number.isInteger(b.n) || b.n < 1 || b.n > MAX_FORK) {
    throw fail('invalidField', 'n', `an integer from 1 to ${MAX_FORK}`, b.n);
  }
  return { n: b.n };
}
