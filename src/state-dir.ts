/**
 * hostd's two directories. The runtime directory (SERVICE_STATE_DIR, tmpfs by default) holds VM
 * sockets, console logs and pid files; after a crash it still holds the folders of the VMs that
 * outlived hostd, which the next start re-adopts (the hypervisor's `sweep` then stops and removes
 * the rest); a clean shutdown removes it. The data directory (SERVICE_DATA_DIR, on disk) holds
 * what must outlive hostd: records, frozen templates, memory images, paused sandboxes; it is
 * kept. One hostd owns each at a time (a pid lock).
 */
import { chmod, chown, mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

async function cmdlineOf(pid: number): Promise<string | null> {
  try {
    return (await readFile(`/proc/${pid}/cmdline`, 'utf8')).replace(/\0/g, ' ');
  } catch {
    // Expected: the process exited since it was listed.
    return null;
  }
}

/**
 * QEMU processes whose command line mentions `dir/`: QEMUs of a previous hostd on this
 * directory. Only QEMU itself, not the jail's keeper (unshare) whose arguments name it too.
 */
export async function findProcessesUsing(dir: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const cmd = await cmdlineOf(pid);
    const program = cmd?.slice(0, cmd.indexOf(' ')).split('/').pop() ?? '';
    if (program.startsWith('qemu-system') && cmd!.includes(`${dir}/`)) pids.push(pid);
  }
  return pids;
}

/** Another live hostd holds a directory: this one must not start, nor touch it. */
export class DirectoryInUseError extends Error {
  constructor(dir: string, holder: number, variable: string) {
    super(`another hostd (pid ${holder}) is using ${dir}; stop it or set ${variable}`);
    this.name = 'DirectoryInUseError';
  }
}

/**
 * Throws DirectoryInUseError when another live hostd holds either directory. Call before
 * claiming either: a refused start must change nothing of a running hostd's directories (a
 * chmod of its state directory locked its QEMUs out of their own folders).
 */
export async function ensureDirsFree(stateDir: string, dataDir: string): Promise<void> {
  await ensureNoOtherHostd(stateDir, 'SERVICE_STATE_DIR');
  await ensureNoOtherHostd(dataDir, 'SERVICE_DATA_DIR');
}

/**
 * Claims the runtime directory `dir` for this process. Fails when another live hostd holds it,
 * before changing anything. The VM folders an earlier run left stay for re-adoption;
 * everything else of that run goes.
 */
export async function claimStateDir(dir: string, vmGroup?: number): Promise<void> {
  await ensureNoOtherHostd(dir, 'SERVICE_STATE_DIR');
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  for (const entry of await readdir(dir)) {
    if (entry !== 'vms') await rm(join(dir, entry), { recursive: true, force: true });
  }
  await writeFile(join(dir, 'hostd.pid'), `${process.pid}\n`, { mode: 0o600 });
  await mkdir(join(dir, 'vms'), { recursive: true, mode: 0o700 });
  if (vmGroup !== undefined) {
    // QEMU runs as an unprivileged user: it may enter (not list) the directory and the VM
    // area, and owns only its own VM's folder.
    for (const d of [dir, join(dir, 'vms')]) {
      await chown(d, 0, vmGroup);
      await chmod(d, 0o710);
    }
  }
}

/**
 * Claims the data directory: fails when another live hostd holds it. Nothing in it is removed
 * here; what no record needs any more is collected once the records are read.
 */
export async function claimDataDir(dir: string, vmGroup?: number): Promise<void> {
  await ensureNoOtherHostd(dir, 'SERVICE_DATA_DIR');
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await writeFile(join(dir, 'hostd.pid'), `${process.pid}\n`, { mode: 0o600 });
  // QEMU's account may pass through to the images it maps, never list or change this folder.
  await chown(dir, 0, vmGroup ?? 0);
  await chmod(dir, vmGroup === undefined ? 0o700 : 0o710);
}

async function ensureNoOtherHostd(dir: string, variable: string): Promise<void> {
  let pidFile = '';
  try {
    pidFile = await readFile(join(dir, 'hostd.pid'), 'utf8');
  } catch (err) {
    // No lock file (a new or cleanly released directory): nobody holds it.
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const holder = Number(pidFile.trim());
  if (!holder || holder === process.pid) return;
  const cmd = await cmdlineOf(holder);
  if (cmd && /node|hostd/.test(cmd)) throw new DirectoryInUseError(dir, holder, variable);
}

/** Lets go of the data directory's lock; its content stays. */
export async function releaseDataDir(dir: string): Promise<void> {
  await rm(join(dir, 'hostd.pid'), { force: true });
}

/** Removes everything, the directory itself included. */
export async function releaseStateDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}
