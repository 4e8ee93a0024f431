/**
 * hostd's private runtime directory (tmpfs by default): VM sockets, console logs and guest RAM
 * images. One hostd owns it at a time (a pid lock). A start after a crash kills the QEMU
 * processes the crashed run left (found by their command line naming this directory) and
 * empties it; a clean shutdown leaves nothing in it.
 */
import { chmod, chown, mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

async function cmdlineOf(pid: number): Promise<string | null> {
  try {
    return (await readFile(`/proc/${pid}/cmdline`, 'utf8')).replace(/\0/g, ' ');
  } catch {
    return null;
  }
}

/** Processes whose command line mentions `dir/`: QEMUs of a previous hostd on this directory. */
export async function findProcessesUsing(dir: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const cmd = await cmdlineOf(pid);
    if (cmd && cmd.includes('qemu-system') && cmd.includes(`${dir}/`)) pids.push(pid);
  }
  return pids;
}

export interface StateDirReport {
  killedProcesses: number;
  removedEntries: number;
}

/**
 * Claims `dir` for this process. Fails when another live hostd holds it; otherwise cleans up
 * whatever a crashed run left and returns what it removed.
 */
export async function claimStateDir(dir: string, vmGroup?: number): Promise<StateDirReport> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const lock = join(dir, 'hostd.pid');
  const holder = Number((await readFile(lock, 'utf8').catch(() => '')).trim());
  if (holder && holder !== process.pid) {
    const cmd = await cmdlineOf(holder);
    if (cmd && /node|hostd/.test(cmd)) {
      throw new Error(
        `another hostd (pid ${holder}) is using ${dir}; stop it or set SERVICE_STATE_DIR`,
      );
    }
  }
  const stale = await findProcessesUsing(dir);
  for (const pid of stale) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* already gone */
    }
  }
  const entries = await readdir(dir);
  await Promise.all(entries.map((e) => rm(join(dir, e), { recursive: true, force: true })));
  await writeFile(lock, `${process.pid}\n`, { mode: 0o600 });
  await mkdir(join(dir, 'vms'), { mode: 0o700 });
  await mkdir(join(dir, 'images'), { mode: 0o700 });
  if (vmGroup !== undefined) {
    // QEMU runs as an unprivileged user: it may enter (not list) the directory and the VM
    // area, and owns only its own VM's folder and the RAM images.
    for (const d of [dir, join(dir, 'vms')]) {
      await chown(d, 0, vmGroup);
      await chmod(d, 0o710);
    }
    // Readable, not writable: QEMU opens the images hostd made for it, but cannot create,
    // rename or replace anything there.
    await chown(join(dir, 'images'), 0, vmGroup);
    await chmod(join(dir, 'images'), 0o750);
  }
  return { killedProcesses: stale.length, removedEntries: entries.length };
}

/** Removes everything, the directory itself included. */
export async function releaseStateDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}
