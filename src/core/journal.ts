/**
 * A record of every sandbox outside hostd's memory: one small JSON file per sandbox, rewritten
 * whenever what it records changes. Operators and tests read it to find a sandbox's machine
 * (`vm` names its folder under the state directory's `vms/`, which holds `qemu.pid`).
 */
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface SandboxRecord {
  readonly id: string;
  readonly template: string;
  readonly parent_id: string | null;
  readonly created_at: string;
  /** The machine's id: its folder under `vms/`. */
  readonly vm: string;
}

export interface SandboxJournal {
  write(record: SandboxRecord): void;
  remove(id: string): void;
}

/** Keeps nothing: for unit tests and tools that need no record. */
export const noJournal: SandboxJournal = { write: () => undefined, remove: () => undefined };

/** One `<id>.json` per sandbox in `dir`, replaced atomically (write, then rename). */
export class FileJournal implements SandboxJournal {
  constructor(private readonly dir: string) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  write(record: SandboxRecord): void {
    const path = join(this.dir, `${record.id}.json`);
    writeFileSync(`${path}.tmp`, JSON.stringify(record) + '\n', { mode: 0o600 });
    renameSync(`${path}.tmp`, path);
  }

  remove(id: string): void {
    rmSync(join(this.dir, `${id}.json`), { force: true });
  }
}
