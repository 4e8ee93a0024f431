/**
 * Request body validation. The native API's bodies are checked against their wire schemas
 * (src/api/wire, the same definitions docs/openapi.json is generated from) by `checkBody`, which
 * turns each failure into a registry error naming the field, what it accepts and what was sent.
 * What stays here is what JSON Schema cannot say, each marked where it is: byte totals, rules
 * between fields, and turning the wire's shape into what core takes. Bodies without a wire
 * schema (the E2B front's, and snapshot's and timeout's small ones) keep hand-written checks
 * with the same messages. Unknown fields are rejected: a typo such as `timeout_ms` should not
 * be ignored.
 */
import { fail } from '../errors.js';
import type { Language } from '../core/sandbox-manager.js';
import {
  CONTEXT_ID_PATTERN,
  ContextCreateRequest,
  CreateRequest,
  ENV_NAME_PATTERN,
  ExecRequest,
  ForkRequest,
  MAX_ENV_BYTES,
  MAX_ENV_ENTRIES,
  MAX_METADATA_BYTES,
  MAX_METADATA_ENTRIES,
  SnapshotRequest,
  TimeoutRequest,
} from './wire/index.js';
import { checkBody, compileAhead } from './wire/check.js';

type Body = Record<string, unknown>;

/** Environment variables: names a shell accepts, string values, bounded in number and size. */
const ENV_NAME = new RegExp(ENV_NAME_PATTERN);

/**
 * Schema cannot: the byte total of an environment (the schema bounds the count and the names).
 * Counted as the guest's `NAME=value\0` entries are.
 */
function envWithinBytes(field: string, env: Record<string, string>): Record<string, string> {
  const entries = Object.entries(env);
  let bytes = 0;
  for (const [name, value] of entries) bytes += name.length + value.length + 2;
  if (bytes > MAX_ENV_BYTES) {
    throw fail(
      'invalidField',
      field,
      `at most ${MAX_ENV_ENTRIES} variables, ${MAX_ENV_BYTES} bytes`,
      `${entries.length} variables, ${bytes} bytes`,
    );
  }
  return env;
}

/** Schema cannot: the byte total of metadata, keys and values in UTF-8. */
function metadataWithinBytes(field: string, m: Record<string, string>): Record<string, string> {
  const entries = Object.entries(m);
  let bytes = 0;
  for (const [key, value] of entries) bytes += Buffer.byteLength(key) + Buffer.byteLength(value);
  if (bytes > MAX_METADATA_BYTES) {
    throw fail(
      'invalidField',
      field,
      `at most ${MAX_METADATA_ENTRIES} entries, ${MAX_METADATA_BYTES} bytes`,
      `${entries.length} entries, ${bytes} bytes`,
    );
  }
  return m;
}

/** An environment in a body without a wire schema (the E2B front's). */
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

/** Metadata: string labels, bounded like the environment (the E2B front's bodies). */
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

export interface CreateBody {
  template?: string;
  snapshot?: string;
  env?: Record<string, string>;
  network?: { allow_out: unknown[] };
  metadata?: Record<string, string>;
  lifetime?: { timeoutS: number; onTimeout: 'delete' | 'pause' };
}

/**
 * Kept from the hand-written check: `network.allow_out: null` reads as no rules, though the
 * contract says an array (a client that sent it keeps working).
 */
function withoutNullRules(body: unknown): unknown {
  const network = (body as { network?: unknown } | null | undefined)?.network;
  if (network === null || typeof network !== 'object' || Array.isArray(network)) return body;
  if (!('allow_out' in network) || network.allow_out !== null) return body;
  const rest: Body = { ...(network as Body) };
  delete rest.allow_out;
  return { ...(body as Body), network: rest };
}

/** Compiles `parseCreate`'s schema check now: the server's first create does not wait for it. */
export function compileCreateCheck(): void {
  compileAhead(CreateRequest);
}

export function parseCreate(body: unknown): CreateBody {
  const b = checkBody(CreateRequest, withoutNullRules(body), 'ok');
  const template = b.template ?? undefined;
  const snapshot = b.snapshot ?? undefined;
  // Schema cannot (without a rule clients would read as a type): one source, not both
  if (template !== undefined && snapshot !== undefined) {
    throw fail('conflictingFields', 'template', 'snapshot');
  }
  const env = b.env == null ? undefined : envWithinBytes('env', b.env);
  const network = b.network == null ? undefined : { allow_out: b.network.allow_out ?? [] };
  const metadata = b.metadata == null ? undefined : metadataWithinBytes('metadata', b.metadata);
  const onTimeout = b.on_timeout ?? undefined;
  const timeout = b.timeout ?? undefined;
  // Schema cannot (a rule between fields): on_timeout only with a timeout
  if (timeout === undefined && onTimeout !== undefined) {
    throw fail('invalidField', 'timeout', 'given with on_timeout', timeout);
  }
  const lifetime =
    timeout === undefined ? undefined : { timeoutS: timeout, onTimeout: onTimeout ?? 'delete' };
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
  const b = checkBody(TimeoutRequest, body, 'refused');
  const onTimeout = b.on_timeout ?? undefined;
  return onTimeout === undefined ? { timeoutS: b.timeout } : { timeoutS: b.timeout, onTimeout };
}

/** Snapshot: no body, or `{"name": "..."}` (1 to 128 printable characters). */
export function parseSnapshot(body: unknown): { name: string | null } {
  return { name: checkBody(SnapshotRequest, body, 'ok').name ?? null };
}

/** Routes that take no body: anything sent is a mistake worth a 400. */
export function parseNoBody(body: unknown, op: string): void {
  if (body !== undefined) throw fail('bodyNotAllowed', op);
}

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
export const CONTEXT_ID = new RegExp(CONTEXT_ID_PATTERN);

export function parseExec(body: unknown): ExecBody {
  const b = checkBody(ExecRequest, body, 'refused');
  const language = b.language ?? 'python';
  const env = b.env == null ? undefined : envWithinBytes('env', b.env);
  const cwd = b.cwd ?? undefined;
  const context = b.context ?? undefined;
  // Schema cannot (rules between fields): the REPL's, so a bash exec has no namespace to run
  // in, nor cells
  if (language === 'bash' && context !== undefined) {
    throw fail('invalidField', 'context', 'absent for a bash exec', context);
  }
  if (language === 'bash' && b.notebook) {
    throw fail('invalidField', 'notebook', 'false or absent for a bash exec', b.notebook);
  }
  const timeout = b.timeout ?? undefined;
  return {
    code: b.code,
    language,
    ...(env === undefined ? {} : { env }),
    ...(cwd === undefined ? {} : { cwd }),
    ...(b.display ? { display: true } : {}),
    ...(context === undefined ? {} : { context }),
    ...(b.notebook ? { notebook: true } : {}),
    ...(timeout === undefined ? {} : { timeoutMs: Math.ceil(timeout * 1000) }),
  };
}

/** `POST /v1/sandboxes/{id}/contexts`: `{}` or no body, or its `id` and `cwd`. */
export function parseContextCreate(body: unknown): { context?: string; cwd?: string } {
  const b = checkBody(ContextCreateRequest, body, 'ok');
  const context = b.id ?? undefined;
  const cwd = b.cwd ?? undefined;
  return {
    ...(context === undefined ? {} : { context }),
    ...(cwd === undefined ? {} : { cwd }),
  };
}

export function parseFork(body: unknown): { n: number } {
  return { n: checkBody(ForkRequest, body, 'refused').n };
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
