/**
 * Request body validation. Hand-written rather than JSON Schema so that every rejection has a
 * message a person can act on ("n must be an integer from 1 to 32, got 33") and the handlers get
 * typed values. Unknown fields are rejected: a typo such as `timeout_ms` should not be ignored.
 */
import { fail } from '../errors.js';
import { MAX_FORK, MAX_LIFETIME_S, type Language } from '../core/sandbox-manager.js';

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

/** Environment variables: names a shell accepts, string values, bounded in number and size. */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_ENV_ENTRIES = 256;
const MAX_ENV_BYTES = 64 * 1024;

export function optionalEnv(b: Body, field: string): Record<string, string> | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) {
    throw fail('invalidField', field, 'an object of string values', v);
  }
  const entries = Object.entries(v as Record<string, unknown>);
  let bytes = 0;
  for (const [name, value] of entries) {
    if (!ENV_NAME.test(name)) {
      throw fail(
        'invalidField',
        `${field} name`,
        'letters, digits and _ (not first a digit)',
        name,
      );
    }
    if (typeof value !== 'string' || value.includes('\0')) {
      throw fail('invalidField', `${field}.${name}`, 'a string without NUL', value);
    }
    bytes += name.length + value.length + 2;
  }
  if (entries.length > MAX_ENV_ENTRIES || bytes > MAX_ENV_BYTES) {
    throw fail(
      'invalidField',
      field,
      `at most ${MAX_ENV_ENTRIES} variables, ${MAX_ENV_BYTES} bytes`,
      `${entries.length} variables, ${bytes} bytes`,
    );
  }
  return Object.fromEntries(entries) as Record<string, string>;
}

/** Metadata: string labels, bounded like the environment. */
const MAX_METADATA_ENTRIES = 64;
const MAX_METADATA_BYTES = 16 * 1024;

export function optionalMetadata(b: Body, field: string): Record<string, string> | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) {
    throw fail('invalidField', field, 'an object of string values', v);
  }
  const entries = Object.entries(v as Record<string, unknown>);
  let bytes = 0;
  for (const [key, value] of entries) {
    if (typeof value !== 'string') throw fail('invalidField', `${field}.${key}`, 'a string', value);
    bytes += Buffer.byteLength(key) + Buffer.byteLength(value);
  }
  if (entries.length > MAX_METADATA_ENTRIES || bytes > MAX_METADATA_BYTES) {
    throw fail(
      'invalidField',
      field,
      `at most ${MAX_METADATA_ENTRIES} entries, ${MAX_METADATA_BYTES} bytes`,
      `${entries.length} entries, ${bytes} bytes`,
    );
  }
  return Object.fromEntries(entries) as Record<string, string>;
}

/** A lifetime in seconds: a number in (0, 30 days]. */
export function parseLifetimeSeconds(value: unknown, field = 'timeout'): number {
  if (
    typeof value !== 'number' ||
    !Number.isFinite(value) ||
    value <= 0 ||
    value > MAX_LIFETIME_S
  ) {
    throw fail('invalidField', field, `a number of seconds in (0, ${MAX_LIFETIME_S}]`, value);
  }
  return value;
}

export interface CreateBody {
  template?: string;
  snapshot?: string;
  env?: Record<string, string>;
  network?: { allow_out: unknown[] };
  metadata?: Record<string, string>;
  lifetime?: { timeoutS: number; onTimeout: 'delete' | 'pause' };
}

export function parseCreate(body: unknown): CreateBody {
  const b = objectBody(body, true);
  onlyFields(b, ['template', 'snapshot', 'env', 'network', 'metadata', 'timeout', 'on_timeout']);
  const template = optionalName(b, 'template');
  const snapshot = optionalName(b, 'snapshot');
  if (template !== undefined && snapshot !== undefined) {
    throw fail('conflictingFields', 'template', 'snapshot');
  }
  const env = optionalEnv(b, 'env');
  const network = optionalNetwork(b);
  const metadata = optionalMetadata(b, 'metadata');
  const onTimeout = b.on_timeout ?? undefined;
  if (onTimeout !== undefined && onTimeout !== 'delete' && onTimeout !== 'pause') {
    throw fail('invalidField', 'on_timeout', '"delete" or "pause"', onTimeout);
  }
  const timeout = b.timeout ?? undefined;
  if (timeout === undefined && onTimeout !== undefined) {
    throw fail('invalidField', 'timeout', 'given with on_timeout', timeout);
  }
  const lifetime =
    timeout === undefined
      ? undefined
      : {
          timeoutS: parseLifetimeSeconds(timeout),
          onTimeout: (onTimeout ?? 'delete') as 'delete' | 'pause',
        };
  return {
    ...(template === undefined ? {} : { template }),
    ...(snapshot === undefined ? {} : { snapshot }),
    ...(env === undefined ? {} : { env }),
    ...(network === undefined ? {} : { network }),
    ...(metadata === undefined ? {} : { metadata }),
    ...(lifetime === undefined ? {} : { lifetime }),
  };
}

/** `POST /v1/sandboxes/{id}/timeout`: `{"timeout": seconds | null, "on_timeout"?}`. */
export function parseSetTimeout(body: unknown): {
  timeoutS: number | null;
  onTimeout?: 'delete' | 'pause';
} {
  const b = objectBody(body, false);
  onlyFields(b, ['timeout', 'on_timeout']);
  if (!('timeout' in b))
    throw fail('invalidField', 'timeout', 'seconds or null (required)', undefined);
  const onTimeout = b.on_timeout ?? undefined;
  if (onTimeout !== undefined && onTimeout !== 'delete' && onTimeout !== 'pause') {
    throw fail('invalidField', 'on_timeout', '"delete" or "pause"', onTimeout);
  }
  const timeoutS = b.timeout === null ? null : parseLifetimeSeconds(b.timeout);
  return onTimeout === undefined ? { timeoutS } : { timeoutS, onTimeout };
}

/** `{"allow_out": [...]}`; the rules themselves are parsed by core's egress policy. */
function optionalNetwork(b: Body): { allow_out: unknown[] } | undefined {
  const v = b.network;
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) {
    throw fail('invalidField', 'network', 'an object with allow_out', v);
  }
  onlyFields(v as Body, ['allow_out']);
  const rules = (v as Body).allow_out ?? [];
  if (!Array.isArray(rules) || rules.length > 256) {
    throw fail('invalidField', 'network.allow_out', 'an array of at most 256 rules', rules);
  }
  return { allow_out: rules };
}

/** Snapshot: no body, or `{"name": "..."}` (1 to 128 printable characters). */
export function parseSnapshot(body: unknown): { name: string | null } {
  const b = objectBody(body, true);
  onlyFields(b, ['name']);
  const name = b.name ?? null;
  if (
    name !== null &&
    (typeof name !== 'string' || !/^[\x21-\x7e][\x20-\x7e]{0,127}$/.test(name))
  ) {
    throw fail('invalidField', 'name', '1 to 128 printable ASCII characters', name);
  }
  return { name: name as string | null };
}

/** Routes that take no body: anything sent is a mistake worth a 400. */
export function parseNoBody(body: unknown, op: string): void {
  if (body !== undefined) throw fail('bodyNotAllowed', op);
}

/** Longest accepted exec timeout: a day. */
export const MAX_TIMEOUT_S = 86_400;

export interface ExecBody {
  code: string;
  language: Language;
  timeoutMs?: number;
  env?: Record<string, string>;
  cwd?: string;
  display?: boolean;
  context?: string;
  notebook?: boolean;
}

/** A REPL context id (docs/api.md, Contexts): what the guest accepts, and safe in a URL. */
export const CONTEXT_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const CONTEXT_ID_RULE = "1 to 64 letters, digits, '_', '.' or '-', first a letter or digit";

function optionalContextId(b: Body, field: string): string | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string' || !CONTEXT_ID.test(v)) {
    throw fail('invalidField', field, CONTEXT_ID_RULE, v);
  }
  return v;
}

function optionalCwd(b: Body): string | undefined {
  const cwd = b.cwd ?? undefined;
  if (
    cwd !== undefined &&
    (typeof cwd !== 'string' || !cwd.startsWith('/') || cwd.includes('\0'))
  ) {
    throw fail('invalidField', 'cwd', 'an absolute path', cwd);
  }
  return cwd as string | undefined;
}

function optionalBoolean(b: Body, field: string): boolean | undefined {
  const v = b[field] ?? undefined;
  if (v !== undefined && typeof v !== 'boolean') throw fail('invalidField', field, 'a boolean', v);
  return v as boolean | undefined;
}

export function parseExec(body: unknown): ExecBody {
  const b = objectBody(body, false);
  onlyFields(b, ['code', 'language', 'timeout', 'env', 'cwd', 'display', 'context', 'notebook']);
  if (typeof b.code !== 'string') {
    throw fail('invalidField', 'code', 'a string (required)', b.code);
  }
  const language = b.language ?? 'python';
  if (language !== 'python' && language !== 'bash') {
    throw fail('invalidField', 'language', '"python" or "bash"', language);
  }
  const env = optionalEnv(b, 'env');
  const cwd = optionalCwd(b);
  const display = optionalBoolean(b, 'display');
  const context = optionalContextId(b, 'context');
  const notebook = optionalBoolean(b, 'notebook');
  // The REPL's: a bash exec has no namespace to run in, nor cells
  if (language === 'bash' && context !== undefined) {
    throw fail('invalidField', 'context', 'absent for a bash exec', context);
  }
  if (language === 'bash' && notebook) {
    throw fail('invalidField', 'notebook', 'false or absent for a bash exec', notebook);
  }
  const options: ExecBody = {
    code: b.code,
    language: language as Language,
    ...(env === undefined ? {} : { env }),
    ...(cwd === undefined ? {} : { cwd }),
    ...(display ? { display: true } : {}),
    ...(context === undefined ? {} : { context }),
    ...(notebook ? { notebook: true } : {}),
  };
  if (b.timeout === undefined || b.timeout === null) return options;
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
  return { ...options, timeoutMs: Math.ceil(b.timeout * 1000) };
}

/** `POST /v1/sandboxes/{id}/contexts`: `{}` or no body, or its `id` and `cwd`. */
export function parseContextCreate(body: unknown): { context?: string; cwd?: string } {
  const b = objectBody(body, true);
  onlyFields(b, ['id', 'cwd']);
  const context = optionalContextId(b, 'id');
  const cwd = optionalCwd(b);
  return {
    ...(context === undefined ? {} : { context }),
    ...(cwd === undefined ? {} : { cwd }),
  };
}

export function parseFork(body: unknown): { n: number } {
  const b = objectBody(body, false);
  onlyFields(b, ['n']);
  if (typeof b.n !== 'number' || !Number.isInteger(b.n) || b.n < 1 || b.n > MAX_FORK) {
    throw fail('invalidField', 'n', `an integer from 1 to ${MAX_FORK}`, b.n);
  }
  return { n: b.n };
}

/**
 * A guest path from the `path` query parameter: absolute, without NUL bytes or `..`
 * components (docs/api.md, Files). The guest checks again; this answers early and the same way.
 */
export function parseGuestPath(value: unknown, param = 'path'): string {
  if (Array.isArray(value)) {
    const times = `the ${param} query parameter is given ${value.length} times`;
    throw fail('invalidPath', String(value[0]), times);
  }
  if (typeof value !== 'string' || value === '') {
    throw fail('invalidPath', String(value ?? ''), `the ${param} query parameter is required`);
  }
  if (!value.startsWith('/')) throw fail('invalidPath', value, 'it must be absolute');
  if (value.includes('\0')) throw fail('invalidPath', value, 'it holds a NUL byte');
  if (value.split('/').includes('..')) throw fail('invalidPath', value, 'it holds ".."');
  return value;
}

/** `mode` of an upload: octal permission bits as a string, default 0644. */
export function parseFileMode(value: unknown): number {
  if (value === undefined) return 0o644;
  if (typeof value !== 'string' || !/^0?[0-7]{1,4}$/.test(value)) {
    throw fail('invalidField', 'mode', 'octal permission bits such as "0644"', value);
  }
  return parseInt(value, 8) & 0o7777;
}

/** A boolean query flag: `1`/`true` or `0`/`false`; absent is false. */
export function parseFlag(value: unknown, name: string): boolean {
  if (value === undefined) return false;
  if (value === '1' || value === 'true') return true;
  if (value === '0' || value === 'false') return false;
  throw fail('invalidField', name, '1, true, 0 or false', value);
}
