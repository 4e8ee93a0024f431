/**
 * envd's messages (E2B's `spec/envd/*.proto`) in proto3 JSON, as E2B's SDKs read and write them
 * (docs/e2b.md, "envd"): lowerCamelCase names, fields at their default value left out, `bytes` as
 * base64, `int64` as a string, enums by name, Timestamps in RFC 3339 with nanoseconds. And the
 * request fields they carry, checked: what is malformed is `invalid_argument`.
 */
import type { FastifyRequest } from 'fastify';
import { fail } from '../../errors.js';
import type {
  DetailedEntry,
  ProcessEnd,
  ProcessInfo,
  ProcessSelector,
  WatchEvent,
} from '../../core/sandbox-manager.js';

type Message = Record<string, unknown>;

/** The user envd runs commands and file operations as when the request names none. */
export const DEFAULT_USER = 'user';

/**
 * The user a Connect request is made as: `Authorization: Basic base64("<user>:")` (the SDKs'
 * `user` option), else the default user.
 */
export function userOf(req: FastifyRequest): string {
  const auth = req.headers.authorization;
  if (auth === undefined || auth.trim() === '') return DEFAULT_USER;
  const m = /^Basic\s+([A-Za-z0-9+/=_-]*)\s*$/i.exec(auth);
  const decoded = m ? Buffer.from(m[1]!, 'base64').toString('utf8') : '';
  const user = decoded.includes(':') ? decoded.slice(0, decoded.indexOf(':')) : decoded;
  if (user === '') throw fail('unknownUser', auth.slice(0, 64));
  return user;
}

export function stringField(msg: Message, name: string, required = true): string | undefined {
  const v = msg[name];
  if (v === undefined || v === null) {
    if (required) throw fail('invalidField', name, 'a string', v);
    return undefined;
  }
  if (typeof v !== 'string') throw fail('invalidField', name, 'a string', v);
  return v;
}

export function boolField(msg: Message, name: string): boolean | undefined {
  const v = msg[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw fail('invalidField', name, 'a boolean', v);
  return v;
}

export function objectField(msg: Message, name: string): Message | undefined {
  const v = msg[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) throw fail('invalidField', name, 'an object', v);
  return v as Message;
}

/** A uint32 (JSON number, or a decimal string as proto3 JSON allows). */
export function uintField(msg: Message, name: string): number | undefined {
  const v = msg[name];
  if (v === undefined || v === null) return undefined;
  const n = typeof v === 'string' && /^\d{1,10}$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff) {
    throw fail('invalidField', name, 'an unsigned integer', v);
  }
  return n;
}

export function stringMapField(msg: Message, name: string): Record<string, string> {
  const v = objectField(msg, name) ?? {};
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string') throw fail('invalidField', `${name}.${k}`, 'a string', x);
  }
  return v as Record<string, string>;
}

/** `bytes`: standard or URL-safe base64, padded or not. */
export function bytesField(msg: Message, name: string): Buffer | undefined {
  const v = msg[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string' || !/^[A-Za-z0-9+/_-]*={0,2}$/.test(v)) {
    throw fail('invalidField', name, 'base64 bytes', v);
  }
  return Buffer.from(v, 'base64');
}

/** A ProcessSelector: `{"pid": N}` or `{"tag": "t"}`. */
export function selectorOf(msg: Message): ProcessSelector {
  const process = objectField(msg, 'process');
  if (!process) throw fail('invalidField', 'process', 'a process selector', undefined);
  const pid = uintField(process, 'pid');
  if (pid !== undefined) return { pid };
  const tag = stringField(process, 'tag', false);
  if (tag !== undefined) return { tag };
  throw fail('invalidField', 'process', 'a pid or a tag', process);
}

// ---- process -----------------------------------------------------------------------------

/** Go's names of signals (syscall.Signal.String on linux), as envd's end status shows them. */
const SIGNAL_NAMES: Record<number, string> = {
  1: 'hangup',
  2: 'interrupt',
  3: 'quit',
  4: 'illegal instruction',
  5: 'trace/breakpoint trap',
  6: 'aborted',
  7: 'bus error',
  8: 'floating point exception',
  9: 'killed',
  10: 'user defined signal 1',
  11: 'segmentation fault',
  12: 'user defined signal 2',
  13: 'broken pipe',
  14: 'alarm clock',
  15: 'terminated',
  16: 'stack fault',
  17: 'child exited',
  18: 'continued',
  19: 'stopped (signal)',
  20: 'stopped',
  21: 'stopped (tty input)',
  22: 'stopped (tty output)',
  23: 'urgent I/O condition',
  24: 'CPU time limit exceeded',
  25: 'file size limit exceeded',
  26: 'virtual timer expired',
  27: 'profiling timer expired',
  28: 'window changed',
  29: 'I/O possible',
  30: 'power failure',
  31: 'bad system call',
};

/**
 * An EndEvent as envd fills it from Go's ProcessState: `exitCode` the status (-1 when a signal
 * ended it), `exited` whether it exited by itself, `status` its String() ("exit status 1",
 * "signal: killed"), and `error` the same text when it did not exit with 0.
 */
export function endEvent(end: ProcessEnd): Message {
  const status =
    end.exitCode !== null
      ? `exit status ${end.exitCode}`
      : `signal: ${SIGNAL_NAMES[end.signal ?? 0] ?? `signal ${end.signal}`}`;
  const exitCode = end.exitCode ?? -1;
  const msg: Message = {};
  if (exitCode !== 0) msg.exitCode = exitCode;
  if (end.exitCode !== null) msg.exited = true;
  msg.status = status;
  if (exitCode !== 0) msg.error = status;
  return msg;
}

/** A ProcessInfo of `List`: `config` always (the SDK reads it unconditionally). */
export function processInfo(p: ProcessInfo): Message {
  const config: Message = { cmd: p.cmd };
  if (p.args.length) config.args = p.args;
  if (Object.keys(p.envs).length) config.envs = p.envs;
  if (p.cwd) config.cwd = p.cwd;
  const info: Message = { config, pid: p.pid };
  if (p.tag !== undefined) info.tag = p.tag;
  return info;
}

// ---- filesystem --------------------------------------------------------------------------

const FILE_TYPES: Record<string, string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
};

/** An RFC 3339 timestamp with nanoseconds (0, 3, 6 or 9 digits, as protobuf prints them). */
export function timestamp(ns: string): string {
  const total = BigInt(ns);
  const seconds = total / 1_000_000_000n;
  const nanos = Number(total % 1_000_000_000n);
  const base = new Date(Number(seconds) * 1000).toISOString().slice(0, 19);
  if (nanos === 0) return `${base}Z`;
  const digits = String(nanos).padStart(9, '0');
  const frac = digits.endsWith('000000')
    ? digits.slice(0, 3)
    : digits.endsWith('000')
      ? digits.slice(0, 6)
      : digits;
  return `${base}.${frac}Z`;
}

/**
 * An EntryInfo as envd fills it: a symbolic link shows its target's type and mode and its
 * resolved path (a dangling one has no type: the SDK's `list` skips it), `permissions` the
 * lstat mode as Go prints it, `size` lstat's.
 */
export function entryInfo(e: DetailedEntry): Message {
  const link = e.type === 'symlink';
  const type = link ? (e.target_type ?? 'other') : e.type;
  const mode = link ? (e.target_mode ?? 0) : e.mode;
  const msg: Message = { name: e.name };
  if (FILE_TYPES[type]) msg.type = FILE_TYPES[type];
  msg.path = e.path;
  if (e.size !== 0) msg.size = String(e.size);
  if (mode !== 0) msg.mode = mode;
  msg.permissions = e.permissions;
  msg.owner = e.owner;
  msg.group = e.group;
  msg.modifiedTime = timestamp(e.mtime_ns);
  if (link) msg.symlinkTarget = e.resolved ?? e.path;
  if (e.metadata && Object.keys(e.metadata).length) msg.metadata = e.metadata;
  return msg;
}

const EVENT_TYPES: Record<WatchEvent['type'], string> = {
  create: 'EVENT_TYPE_CREATE',
  write: 'EVENT_TYPE_WRITE',
  remove: 'EVENT_TYPE_REMOVE',
  rename: 'EVENT_TYPE_RENAME',
  chmod: 'EVENT_TYPE_CHMOD',
};

/** A FilesystemEvent; its entry only when asked for (`includeEntry`) and the guest had one. */
export function filesystemEvent(e: WatchEvent, entries: boolean): Message {
  const msg: Message = { name: e.name, type: EVENT_TYPES[e.type] };
  if (entries && e.entry) msg.entry = entryInfo(e.entry);
  return msg;
}
