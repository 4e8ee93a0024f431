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
import { fsSyncer, type Syncer } from '../vm/storage/durable.js';

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

/** How a `FileRecords` writes; every field has the default a plain folder of records wants. */
export interface FileRecordsOptions<R> {
  /**
   * Whether `record` must outlive the host (synced off the loop, see `FileRecords`); every record
   * does by default.
   */
  readonly lastsReboot?: (record: R) => boolean;
  /** Syncs files and the folder off the loop (tests hold or fail them). */
  readonly syncer?: Syncer;
  /** A file's sync on the loop, for `readAll` at start only (tests record it). */
  readonly syncNow?: (path: string) => void;
  /**
   * Whether a write that is not durable goes to a file opened ahead, after the turn of the
   * loop of the write before it (`<dir>/.ahead-<pid>-<n>.tmp`, one at a time): the `open` of
   * a new file is most of a record's write (165 µs p50 on this ext4 when writes come tens of
   * ms apart, against 95 µs for the write and rename of one opened ahead), and a pool hit's
   * create waits for its record: its record's write took 0.13 ms against 0.19 without, in
   * the request, in 4 of 4 rounds (docs/architecture.md, "A pool hit's create, session 12").
   * Off by default; whoever turns it on calls `closeAhead` at its stop.
   */
  readonly openAhead?: boolean;
}

/**
 * One `<id>.json` per record in `dir`, replaced atomically (a crash of hostd loses none), and
 * synced to disk when `lastsReboot` says the record must outlive the host. A record that only
 * matters while the host stays up is not synced: fsync holds hostd's event loop on every create,
 * fork child and delete (docs/architecture.md, "Measured choices in the code"). One that must is
 * synced off the loop too: its content is written to a file of its own, fsynced on the thread
 * pool, and only then renamed over its name, so that a power cut finds the old record or the new
 * one whole; `flush` waits for that, then syncs the folder. A crash of hostd meanwhile leaves
 * that file, which the next start puts in place (`readAll`), as if renamed at once.
 */
export class FileRecords<R extends { id: string }> implements RecordStore<R> {
  /** Numbers the names removed records are moved to, so that two never meet. */
  private removals = 0;
  /** Numbers the files durable records are written to before their sync, likewise. */
  private writes = 0;
  /** A record that must outlive the host was renamed into place since the last folder sync. */
  private entriesUnsynced = false;
  private lastFolderSync: Promise<void> = Promise.resolve();
  /**
   * Each record's durable write whose content sync runs, by id: only the newest renames itself
   * into place; a later write (durable or not) or a removal of the record supersedes it.
   */
  private readonly pending = new Map<string, { readonly tmp: string }>();
  /** The files of durable writes whose sync runs: not what a crash left (`readAll`). */
  private readonly syncingFiles = new Set<string>();
  /** Content syncs under way: each resolves with its failure, or null (never rejects). */
  private readonly syncing = new Set<Promise<unknown>>();
  /** Content syncs that failed before any flush waited for them: the next flush reports them. */
  private readonly unreported = new Set<Promise<unknown>>();

  /** The file opened ahead for the next write that is not durable (`openAhead`), or null. */
  private ahead: { readonly fd: number; readonly path: string } | null = null;
  /** Numbers the files opened ahead, likewise. */
  private aheads = 0;
  /** Descriptors of files opened ahead and written since, closed after the write's turn. */
  private readonly toClose: number[] = [];
  private aheadTask: NodeJS.Immediate | null = null;
  /** `closeAhead` ran: no file is opened ahead any more. */
  private aheadClosed = false;

  private readonly lastsReboot: (record: R) => boolean;
  private readonly syncer: Syncer;
  private readonly syncNow: (path: string) => void;
  private readonly openAhead: boolean;

  constructor(
    private readonly dir: string,
    options: FileRecordsOptions<R> = {},
  ) {
    this.lastsReboot = options.lastsReboot ?? (() => true);
    this.syncer = options.syncer ?? fsSyncer;
    this.syncNow = options.syncNow ?? fsyncFile;
    this.openAhead = options.openAhead ?? false;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  write(record: R): void {
    const path = join(this.dir, `${record.id}.json`);
    const text = JSON.stringify(record) + '\n';
    const durable = this.lastsReboot(record);
    if (!durable) {
      const tmp = this.writeAhead(text) ?? writeNew(`${path}.tmp`, text);
      // Newer than a durable write of it still syncing, which must not land over it (below).
      this.supersede(record.id);
      renameSync(tmp, path);
      return;
    }
    const tmp = writeNew(`${path}.${process.pid}-${++this.writes}.tmp`, text);
    // Newer than a durable write of it still syncing, which must not land over it: that one's
    // file goes first, so that a file of one left by a crash is always newer than the record.
    this.supersede(record.id);
    const mine = { tmp };
    this.pending.set(record.id, mine);
    this.syncingFiles.add(tmp);
    const sync = this.syncer.file(tmp).then(
      () => {
        // Superseded (written again, or removed) meanwhile: its file is gone already.
        if (this.pending.get(record.id) !== mine) return null;
        this.pending.delete(record.id);
        renameSync(tmp, path);
        this.entriesUnsynced = true;
        return null;
      },
      (err: unknown) => {
        // Superseded meanwhile: its file was removed (maybe before the sync could open it,
        // ENOENT), and the newer write or the removal is the record. Not a failure of it.
        if (this.pending.get(record.id) !== mine) return null;
        this.pending.delete(record.id);
        rmSync(tmp, { force: true });
        return err;
      },
    );
    const tracked: Promise<unknown> = sync
      .catch((err: unknown) => err) // renameSync's failure
      .then((err) => {
        this.syncingFiles.delete(tmp);
        this.syncing.delete(tracked);
        if (err !== null) this.unreported.add(tracked);
        return err;
      });
    this.syncing.add(tracked);
  }

  /**
   * Resolves once every durable record written before it is on disk under its name: its
   * content synced and renamed into place (off the event loop, see `write`), then the folder
   * synced when a durable record was renamed into it since the last sync began (the rename is
   * only on disk once the folder is). One folder sync serves every record renamed before it
   * started. Rejects when a content sync or the folder's failed: that record is not in place.
   */
  async flush(): Promise<void> {
    const waited = [...this.syncing, ...this.unreported];
    const failures = await Promise.all(waited);
    for (const w of waited) this.unreported.delete(w);
    const failed = failures.find((err) => err !== null);
    if (failed !== undefined) throw failed;
    if (this.entriesUnsynced) {
      this.entriesUnsynced = false;
      this.lastFolderSync = this.syncer.dir(this.dir).catch((err: unknown) => {
        this.entriesUnsynced = true; // the next flush tries again
        throw err;
      });
    }
    return this.lastFolderSync;
  }

  /**
   * Writes `text` to the file opened ahead and returns its path, or null when none is open (the
   * first write, one in the same turn as the last, `openAhead` off). Either way, the next file
   * is opened after this turn of the loop, when the answer waiting for this write is out.
   */
  private writeAhead(text: string): string | null {
    if (!this.openAhead || this.aheadClosed) return null;
    const ahead = this.ahead;
    this.ahead = null;
    this.aheadTask ??= setImmediate(() => this.prepareAhead());
    if (!ahead) return null;
    this.toClose.push(ahead.fd);
    try {
      writeSync(ahead.fd, text);
    } catch (err) {
      rmSync(ahead.path, { force: true });
      throw err;
    }
    return ahead.path;
  }

  /**
   * Closes and removes the file opened ahead (`openAhead`), closes those written since, and
   * opens no other: at hostd's stop, so that a clean stop leaves no `.ahead-*.tmp` in the folder
   * and no descriptor or pending callback behind (one left by a crash goes at the next start's
   * `readAll`). Writes after it open their own files, as without `openAhead`.
   */
  closeAhead(): void {
    this.aheadClosed = true;
    if (this.aheadTask) clearImmediate(this.aheadTask);
    this.aheadTask = null;
    this.closeWritten();
    const ahead = this.ahead;
    this.ahead = null;
    if (!ahead) return;
    try {
      closeSync(ahead.fd);
    } catch {
      // Never written: nothing is lost with it.
    }
    rmSync(ahead.path, { force: true });
  }

  /** Closes the files written since the last turn and opens the next one. */
  private prepareAhead(): void {
    this.aheadTask = null;
    this.closeWritten();
    if (this.ahead || this.aheadClosed) return;
    const path = join(this.dir, `.ahead-${process.pid}-${++this.aheads}.tmp`);
    try {
      this.ahead = { fd: openSync(path, 'w', 0o600), path };
    } catch {
      // The next write opens its own file, as without `openAhead`, and tries again after it.
    }
  }

  /** Closes the files opened ahead and written since the last turn. */
  private closeWritten(): void {
    for (const fd of this.toClose.splice(0)) {
      try {
        closeSync(fd);
      } catch {
        // Written and renamed already: a failed close loses nothing, and throwing here would
        // take hostd down from a callback of its own.
      }
    }
  }

  /**
   * Drops the durable write of record `id` whose sync runs, if any: it will not be renamed in,
   * and its file goes now (a small file never renamed over anything: its unlink does not wait
   * for the disk), so that what a crash leaves of a durable write is always the record's newest.
   */
  private supersede(id: string): void {
    const older = this.pending.get(id);
    if (!older) return;
    this.pending.delete(id);
    rmSync(older.tmp, { force: true });
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
    // A durable write of it still syncing does not land afterwards.
    this.supersede(id);
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

  /**
   * Every record as last written. A durable write a crash of hostd interrupted between its write
   * and its rename (its sync under way) is the record's newest (`supersede`): put in place when
   * it was written whole, else dropped (a power cut may leave it torn: the record before it is
   * durable). What else a crash left mid-write or mid-removal is dropped.
   */
  readAll(onBad: (file: string, err: unknown) => void = () => undefined): R[] {
    for (const name of readdirSync(this.dir)) {
      const path = join(this.dir, name);
      if (!DURABLE_TMP.test(name) || this.syncingFiles.has(path)) continue;
      try {
        const text = readFileSync(path, 'utf8');
        // Written whole: what write() writes ends with a newline, and parses.
        if (!text.endsWith('\n')) throw new Error('torn');
        JSON.parse(text);
        // Whole in the page cache after a crash of hostd alone, its sync maybe never done: synced
        // before it replaces a record that is durable, which a power cut must not tear.
        this.syncNow(path);
        renameSync(path, path.replace(DURABLE_TMP_SUFFIX, ''));
      } catch {
        rmSync(path, { force: true });
      }
    }
    const records: R[] = [];
    for (const name of readdirSync(this.dir)) {
      const path = join(this.dir, name);
      if (!name.endsWith('.json')) {
        if (this.syncingFiles.has(path)) continue; // a durable write of this run, syncing
        if (path === this.ahead?.path) continue; // opened ahead by this run, not yet written
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

/** A durable write's file before its rename, `<id>.json.<pid>-<n>.tmp`, and its suffix. */
const DURABLE_TMP = /\.json\.\d+-\d+\.tmp$/;
const DURABLE_TMP_SUFFIX = /\.\d+-\d+\.tmp$/;

/** Writes `text` to a new file at `path` (replacing any there) and returns `path`. */
function writeNew(path: string, text: string): string {
  const fd = openSync(path, 'w', 0o600);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
  return path;
}

/** fsync of the file at `path`, on the loop. */
function fsyncFile(path: string): void {
  const fd = openSync(path, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
