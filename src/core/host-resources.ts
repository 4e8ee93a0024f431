/**
 * Checks that the host can afford another VM before starting one: an out-of-memory host
 * kills processes at random (hostd itself, or another sandbox), and a full disk makes a fork's
 * image copy fail midway. Failing early gives the client a clear error instead.
 */
import { openSync, readFileSync, readSync, statfsSync } from 'node:fs';

export interface HostFree {
  memAvailableMib: number;
  dataDirFreeMib: number;
}

/** Free memory, and free space where memory images are written (the data directory). */
export function hostFree(dataDir: string): HostFree {
  const meminfo = readMeminfo();
  const m = /^MemAvailable:\s+(\d+) kB/m.exec(meminfo);
  const fs = statfsSync(dataDir);
  return {
    memAvailableMib: m ? Number(m[1]) / 1024 : Infinity,
    dataDirFreeMib: (fs.bavail * fs.bsize) / 1024 / 1024,
  };
}

let meminfoFd: number | null = null;
const meminfoBuf = Buffer.allocUnsafe(16 * 1024);

/**
 * `/proc/meminfo`'s text, read from offset 0 of a descriptor kept open (the kernel writes the
 * file anew at each read from 0): `readFileSync` opened, sized and closed it each time, 125 µs
 * (p50) when read a few hundred ms apart on the bench host against 70 µs this way
 * (docs/architecture.md, "A pool hit's create, session 11"). The file is ~1.5 KiB; a longer one
 * than the buffer is read whole the old way.
 */
export function readMeminfo(): string {
  meminfoFd ??= openSync('/proc/meminfo', 'r');
  const n = readSync(meminfoFd, meminfoBuf, 0, meminfoBuf.length, 0);
  if (n === meminfoBuf.length) return readFileSync('/proc/meminfo', 'utf8');
  return meminfoBuf.toString('latin1', 0, n);
}

/**
 * How long (ms) `cachedHostFree` reuses a reading. A pool hit's create reads the host twice in
 * the same tick (its admission, then the refill's check), ~30 to 45 µs each here
 * (docs/architecture.md, "Exec latency on a slow TCG host"). A reading this old is as safe as a
 * fresh one: a VM's memory appears over its restore, hundreds of milliseconds under TCG, so a
 * fresh reading misses the VMs still starting anyway, and what other processes take in 100 ms
 * is what the reserve (SERVICE_MIN_FREE_MIB) is there for.
 */
export const HOST_FREE_REUSE_MS = 100;

/**
 * `hostFree(dataDir)`, read again only when the last reading is `reuseMs` old: for the
 * admission's checks, which come in bursts (a create and its pool's refill; a fork's children).
 */
export function cachedHostFree(
  dataDir: string,
  reuseMs = HOST_FREE_REUSE_MS,
  read: (dir: string) => HostFree = hostFree,
): () => HostFree {
  let last: { at: number; free: HostFree } | null = null;
  return () => {
    const now = performance.now();
    if (last === null || now - last.at >= reuseMs) last = { at: now, free: read(dataDir) };
    return { ...last.free };
  };
}

/** The host's total memory in MiB (MemTotal), which the default sandbox cap follows. */
export function hostMemTotalMib(): number {
  const m = /^MemTotal:\s+(\d+) kB/m.exec(readMeminfo());
  return m ? Number(m[1]) / 1024 : 0;
}

/**
 * Returns why starting `vms` more VMs (and writing `imageMib` of image) would leave less than
 * `reserveMib` free, or null when it is fine. `perVmMib` is the estimated cost of one idle VM.
 */
export function shortage(
  free: HostFree,
  need: { vms: number; perVmMib: number; imageMib: number; reserveMib: number },
): string | null {
  const mem = need.vms * need.perVmMib + need.imageMib + need.reserveMib;
  if (free.memAvailableMib < mem) {
    return `not enough host memory: ${Math.round(free.memAvailableMib)} MiB available, ${Math.round(mem)} MiB needed (including the ${need.reserveMib} MiB reserve, SERVICE_MIN_FREE_MIB)`;
  }
  return diskShortage(free, need.imageMib, need.reserveMib);
}

/**
 * Why writing `mib` to the data directory would leave less than `reserveMib` free there, or
 * null: a VM's start (its image), or files copied from another node (cluster mode).
 */
export function diskShortage(free: HostFree, mib: number, reserveMib: number): string | null {
  const disk = mib + reserveMib;
  if (free.dataDirFreeMib < disk) {
    return `not enough disk space in the data directory: ${Math.round(free.dataDirFreeMib)} MiB free, ${Math.round(disk)} MiB needed`;
  }
  return null;
}
