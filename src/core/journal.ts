/**
 * hostd's records, outside its memory and durable: one small JSON file per sandbox and per
 * snapshot in the data directory, rewritten atomically whenever what it records changes, and
 * synced to disk when it must outlive the host (a snapshot, a paused sandbox). A restart reads
 * them back: paused sandboxes, snapshots, and the sandboxes whose VMs outlived a crash
 * (docs/api.md, "Restarts and crashes"). Operators and tests read them too: a running
 * sandbox's `vm` names its folder under the state directory's `vms/`, which holds `qemu.pid`.
 */
import { closeSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { renameSync, rmSync, writeSync } from 'node:fs';
import { unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { MachineDescriptor, PausedDescriptor, StateDescriptor } from '../vm/machine.js';
import { fsSyncer } from '../vm/storage/durable.js';

export interface SandboxRecord {
  readonly id: string;
  readonly template: string;
  readonly parent_id: string | null;
  readonly snapshot_id: string | null;
  readonly created_at: string;
  /** Its egress rules (absent in records of older runs: none). */
  readonly allow_out?: readonly string[];
  /** Winners merged into it, oldest first (absent: none). */
  readonly merged_from?: readonly { readonly id: string; readonly merged_at: string }[];
  /** Its labels (absent in records of older runs: none). */
  readonly metadata?: Readonly<Record<string, string>>;
  /** Its running-time limit (absent or null: none). */
  readonly lifetime?: {
    readonly timeout_s: number;
    readonly on_timeout: 'delete' | 'pause';
  } | null;
  /** When a running sandbox's lifetime ends (ISO 8601); null while paused or without one. */
  readonly expires_at?: string | null;
  readonly state: 'running' | 'paused' | 'lost';
  /** A running sandbox's machine id: its folder under `vms/`. */
  readonly vm?: string;
  /** A running sandbox's machine, for its re-adoption after a crash of hostd. */
  readonly running?: MachineDescriptor;
  /** A paused sandbox's machine on disk. */
  readonly paused?: PausedDescriptor;
  readonly paused_at?: string;
  /** Who paused it (absent in records of older runs: unknown, shown as null). */
  readonly paused_by?: 'request' | 'lifetime' | 'idle' | 'shutdown' | null;
  /** Why a lost sandbox was lost. */
  readonly error?: string;
}

export interface SnapshotRecord {
  readonly id: string;
  readonly source_sandbox_id: string;
  readonly template: string;
  readonly created_at: string;
  readonly size_bytes: number;
  /** A name of the caller's (absent in records of older runs: none). */
  readonly name?: string | null;
  /** The source sandbox's egress rules: sandboxes created from the snapshot inherit them. */
  readonly allow_out?: readonly string[];
  readonly state: StateDescriptor;
}

/** A folder of `<id>.json` records. */
export interface RecordStore<R extends { id: string }> {
  /** Writes `record` whole; one that must outlive the host is durable once `flush` resolves. */
  write(record: R): void;
  /**
   * Resolves when every record written so far that must outlive the host is on disk under its
   * name (its folder's entry synced too). Await it before telling anyone such a record exists.
   */
  flush(): Promise<void>;
  remove(id: string): void;
  /** Every record, as written; unreadable files are skipped (reported through `onBad`). */
  readAll(onBad?: (file: string, err: unknown) => void): R[];
}

/** Keeps nothing: for unit tests and tools that need no record. */
export function memoryRecords<R extends { id: string }>(): RecordStore<R> & {
  map: Map<string, R>;
} {
  const map = new Map<string, R>();
  return {
    map,
    write: (r) => void map.set(r.id, r),
    flush: () => Promise.resolve(),
    remove: (id) => void map.delete(id),
    readAll: () => [...map.values()],
  };
}

/**
 * One `<id>.json` per record in `dir`, replaced atomically (a crash of hostd loses none), and
 * synced to disk when `lastsReboot` says the record must outlive the host. A record that only
 * matters while the host stays up is not synced: fsync holds hostd's event loop on every create,
 * fork child and delete (docs/architecture.md, "Measured choices in the code").
 */
export class FileRecords<R extends { id: string }> implements RecordStore<R> {
  /** Numbers the names removed records are moved to, so that two never meet. */
  private removals = 0;
  /** A record that must outlive the host was renamed into place since the last folder sync. */
  private entriesUnsynced = false;
  private lastFolderSync: Promise<void> = Promise.resolve();

  constructor(
    private readonly dir: string,
    private readonly lastsReboot: (record: R) => boolean = () => true,
  ) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  write(record: R): void {
    const path = join(this.dir, `${record.id}.json`);
    const durable = this.lastsReboot(record);
    const fd = openSync(`${path}.tmp`, 'w', 0o600);
    try {
      writeSync(fd, JSON.stringify(record) + '\n');
      if (durable) fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(`${path}.tmp`, path);
    if (durable) this.entriesUnsynced = true;
  }

  /**
   * Syncs the folder, off the event loop, when a durable record was renamed into it since the
   * last sync began: the rename is only on disk once the folder is. One sync serves every
   * record written before it started.
   */
  flush(): Promise<void> {
    if (this.entriesUnsynced) {
      this.entriesUnsynced = false;
      this.lastFolderSync = fsSyncer.dir(this.dir).catch((err: unknown) => {
        this.entriesUnsynced = true; // the next flush tries again
        throw err;
      });
    }
    return this.lastFolderSync;
  }

  /**
   * Takes the record's name away at once (a crash from here on does not read it back), then
   * frees its file off the event loop: on ext4 (`auto_da_alloc`) the unlink of a record that was
   * rewritten (renamed over its older self: a lifetime, labels, a merge) waits for that write to
   * reach the disk, which held the loop 2 to 6 ms a delete. A rename to a name no record has
   * (docs/architecture.md, "Measured choices in the code") frees nothing and does not wait; what
   * a crash leaves under that name, `readAll` removes.
   */
  remove(id: string): void {
    const path = join(this.dir, `${id}.json`);
    const aside = `${path}.${process.pid}-${++this.removals}.gone`;
    try {
      renameSync(path, aside);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    unlink(aside).catch(() => undefined);
  }

  readAll(onBad: (file: string, err: unknown) => void = () => undefined): R[] {
    const records: R[] = [];
    for (const name of readdirSync(this.dir)) {
      const path = join(this.dir, name);
      if (!name.endsWith('.json')) {
        rmSync(path, { force: true }); // a write or a removal a crash interrupted
        continue;
      }
      try {
        records.push(JSON.parse(readFileSync(path, 'utf8')) as R);
      } catch (err) {
        onBad(name, err);
      }
    }
    return records;
  }
}
