/**
 * What the files port answers to operations as a user (guest/PROTOCOL.md, "As a user"): entries
 * with owner, group, Go-style permissions and what a link leads to, and the answers of mkdir,
 * move and in-place writes. Checked field by field as file-transfers.ts checks the plain ones:
 * null for anything malformed.
 */
import { type EntryType, type FileEntry, toEntry } from './file-transfers.js';

/** An entry with everything E2B's EntryInfo shows. */
export interface DetailedEntry extends FileEntry {
  /** User and group names (the decimal id when the guest has no name for it). */
  owner: string;
  group: string;
  /** The lstat mode as Go prints an os.FileMode: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`. */
  permissions: string;
  /** mtime in ns since the epoch, a decimal string (it does not fit a double). */
  mtime_ns: string;
  /** The file's `user.e2b.*` extended attributes, prefix stripped. */
  metadata?: Record<string, string>;
  /** Symbolic links: the absolute path it leads to (itself when it dangles). */
  resolved?: string;
  /** Symbolic links: the target's type and permission bits, null when it dangles. */
  target_type?: EntryType | null;
  target_mode?: number | null;
}

export interface MkdirResult {
  path: string;
  /** False when it was a directory already. */
  created: boolean;
  entry: DetailedEntry;
}

export interface MoveResult {
  path: string;
  entry: DetailedEntry;
}

export interface UserWriteResult {
  path: string;
  size: number;
  metadata?: Record<string, string>;
}

const ENTRY_TYPES: ReadonlySet<string> = new Set(['file', 'dir', 'symlink', 'other']);

function isStringMap(v: unknown): v is Record<string, string> {
  return (
    typeof v === 'object' &&
    v !== null &&
    !Array.isArray(v) &&
    Object.values(v).every((x) => typeof x === 'string')
  );
}

export function toDetailedEntry(value: unknown): DetailedEntry | null {
  const entry = toEntry(value);
  if (!entry) return null;
  const e = value as Record<string, unknown>;
  if (
    typeof e.owner !== 'string' ||
    typeof e.group !== 'string' ||
    typeof e.permissions !== 'string' ||
    typeof e.mtime_ns !== 'string' ||
    !/^-?\d{1,25}$/.test(e.mtime_ns)
  ) {
    return null;
  }
  const detailed: DetailedEntry = {
    ...entry,
    owner: e.owner,
    group: e.group,
    permissions: e.permissions,
    mtime_ns: e.mtime_ns,
  };
  if (e.metadata !== undefined) {
    if (!isStringMap(e.metadata)) return null;
    detailed.metadata = e.metadata;
  }
  if (entry.type === 'symlink') {
    detailed.resolved = typeof e.resolved === 'string' ? e.resolved : entry.path;
    detailed.target_type =
      typeof e.target_type === 'string' && ENTRY_TYPES.has(e.target_type)
        ? (e.target_type as EntryType)
        : null;
    detailed.target_mode = Number.isSafeInteger(e.target_mode) ? (e.target_mode as number) : null;
  }
  return detailed;
}

export function toDetailedEntries(done: Record<string, unknown>): DetailedEntry[] | null {
  if (!Array.isArray(done.entries)) return null;
  const entries = done.entries.map(toDetailedEntry);
  return entries.every((e) => e !== null) ? (entries as DetailedEntry[]) : null;
}

export function toMkdirResult(done: Record<string, unknown>): MkdirResult | null {
  const entry = toDetailedEntry(done.entry);
  return typeof done.path === 'string' && typeof done.created === 'boolean' && entry
    ? { path: done.path, created: done.created, entry }
    : null;
}

export function toMoveResult(done: Record<string, unknown>): MoveResult | null {
  const entry = toDetailedEntry(done.entry);
  return typeof done.path === 'string' && entry ? { path: done.path, entry } : null;
}

export function toUserWriteResult(done: Record<string, unknown>): UserWriteResult | null {
  if (typeof done.path !== 'string' || !Number.isSafeInteger(done.size)) return null;
  const result: UserWriteResult = { path: done.path, size: done.size as number };
  if (done.metadata !== undefined) {
    if (!isStringMap(done.metadata)) return null;
    result.metadata = done.metadata;
  }
  return result;
}
