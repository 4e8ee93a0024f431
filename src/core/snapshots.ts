/**
 * Snapshots: a sandbox's whole state kept on disk (a frozen state of the hypervisor, the same
 * thing a fork makes) under an id users create sandboxes from, any number of times. Each holds a
 * reference to its state; sandboxes made from it hold their own, so deleting a snapshot only
 * removes it from the list: its files go when the last sandbox using them does.
 */
import { fail } from '../errors.js';
import type { FrozenState, Hypervisor } from '../vm/machine.js';
import { isSnapshotId, newSnapshotId } from './ids.js';
import { memoryRecords, type RecordStore, type SnapshotRecord } from './journal.js';

/** What the API returns for a snapshot (docs/api.md, Snapshots). */
export interface SnapshotInfo {
  snapshot_id: string;
  source_sandbox_id: string;
  template: string;
  size_bytes: number;
  created_at: string;
  /** Running or paused sandboxes still using its files (created from it, or forked from those). */
  sandboxes: number;
  /** The name it was given, if any (not unique: creates by name take the newest). */
  name: string | null;
}

interface Entry {
  readonly record: SnapshotRecord;
  readonly state: FrozenState;
}

export class Snapshots {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly hypervisor: Hypervisor,
    private readonly records: RecordStore<SnapshotRecord> = memoryRecords(),
    /** How many sandboxes use a snapshot now. */
    private readonly users: (snapshotId: string) => number = () => 0,
  ) {}

  /** Reopens every snapshot the records name; returns those that could not be (with why). */
  async load(): Promise<{ id: string; why: string }[]> {
    const failed: { id: string; why: string }[] = [];
    for (const record of this.records.readAll()) {
      try {
        const state = (await this.hypervisor.openState(record.state)).retain();
        this.entries.set(record.id, { record, state });
      } catch (err) {
        failed.push({ id: record.id, why: err instanceof Error ? err.message : String(err) });
        this.records.remove(record.id);
      }
    }
    return failed;
  }

  /**
   * Keeps `state` (whose reference it takes over, durable already: Hypervisor.persistState) as
   * a new snapshot of `source`; resolves once its record is durable too.
   */
  async add(
    state: FrozenState,
    source: { id: string; template: string; allowOut: readonly string[] },
    sizeBytes: number,
    name: string | null = null,
  ): Promise<SnapshotInfo> {
    const record: SnapshotRecord = {
      id: newSnapshotId(),
      name,
      source_sandbox_id: source.id,
      template: source.template,
      created_at: new Date().toISOString(),
      size_bytes: sizeBytes,
      allow_out: [...source.allowOut],
      state: this.hypervisor.describeState(state),
    };
    return this.keep(record, state);
  }

  /**
   * Takes in a snapshot handed over from another node (a drain): the same id, name and dates,
   * over `state` (whose reference it takes over), as made here by `importState`.
   */
  async adopt(record: SnapshotRecord, state: FrozenState): Promise<SnapshotInfo> {
    if (this.entries.has(record.id)) {
      state.release();
      throw fail('clusterConflict', record.id);
    }
    return this.keep({ ...record, state: this.hypervisor.describeState(state) }, state);
  }

  /**
   * Writes `record` and lists it once the record is durable (the state's files are already):
   * a snapshot is listed, and its id answered, only once it survives a host crash. On failure
   * nothing is kept.
   */
  private async keep(record: SnapshotRecord, state: FrozenState): Promise<SnapshotInfo> {
    try {
      this.records.write(record);
      await this.records.flush();
    } catch (err) {
      try {
        this.records.remove(record.id);
      } finally {
        // Let go even when the remove fails too (a failing disk fails both): a record left
        // behind names files that are gone, and the next start drops it (`load`).
        state.release();
      }
      throw err;
    }
    this.entries.set(record.id, { record, state });
    return this.info(this.entries.get(record.id)!);
  }

  /** Snapshot `id`'s record and state, for its hand-over to another node. */
  entry(id: string): { record: SnapshotRecord; state: FrozenState } {
    const { record, state } = this.find(id);
    return { record, state };
  }

  /** The state of snapshot `id`, to restore a sandbox from. */
  get(id: string): { state: FrozenState; template: string; allowOut: readonly string[] } {
    const entry = this.find(id);
    const { template, allow_out: allowOut = [] } = entry.record;
    return { state: entry.state, template, allowOut };
  }

  has(id: string): boolean {
    return this.entries.has(id);
  }

  describe(id: string): SnapshotInfo {
    return this.info(this.find(id));
  }

  /** The newest snapshot named `name`, or null. */
  byName(name: string): SnapshotInfo | null {
    let newest: Entry | null = null;
    // In the order they were taken: of two taken in the same millisecond, the later wins.
    for (const e of this.entries.values()) {
      if (e.record.name !== name) continue;
      if (!newest || e.record.created_at >= newest.record.created_at) newest = e;
    }
    return newest ? this.info(newest) : null;
  }

  /** Newest first. */
  list(): SnapshotInfo[] {
    return [...this.entries.values()]
      .map((e) => this.info(e))
      .sort((a, b) => b.created_at.localeCompare(a.created_at));
  }

  delete(id: string): void {
    const entry = this.find(id);
    this.entries.delete(id);
    this.records.remove(id);
    entry.state.release();
  }

  /** Bytes all snapshots take on disk. */
  get sizeBytes(): number {
    let n = 0;
    for (const e of this.entries.values()) n += e.record.size_bytes;
    return n;
  }

  private find(id: string): Entry {
    const entry = isSnapshotId(id) ? this.entries.get(id) : undefined;
    if (!entry) throw fail('snapshotNotFound', id);
    return entry;
  }

  private info({ record }: Entry): SnapshotInfo {
    return {
      snapshot_id: record.id,
      source_sandbox_id: record.source_sandbox_id,
      template: record.template,
      size_bytes: record.size_bytes,
      created_at: record.created_at,
      sandboxes: this.users(record.id),
      name: record.name ?? null,
    };
  }
}
