/**
 * What the bench reads of processes and of the host from /proc: CPU time, memory by mapping
 * kind, the machine it runs on. Kept apart from the figures so every part of the bench reads
 * them the same way.
 */
import { readFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';

/** CPU milliseconds (user + system) process `pid` has used so far; 0 once it is gone. */
export function cpuMs(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
  } catch {
    return 0;
  }
}

/** Proportional set size of a process in MiB (shared pages divided among their users). */
export function pssMib(pid: number): number {
  return rollup(pid, 'Pss');
}

export function rssMib(pid: number): number {
  return rollup(pid, 'Rss');
}

function rollup(pid: number, field: string): number {
  try {
    const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text);
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

/** Memory of one QEMU by what it is for, in MiB: the parts issue 15 asks to bound. */
export interface QemuMemory {
  guest_ram_rss_mib: number;
  guest_ram_anon_mib: number;
  tcg_buffer_rss_mib: number;
  tcg_buffer_huge_mib: number;
  heap_rss_mib: number;
  other_anon_mib: number;
  libraries_pss_mib: number;
  total_pss_mib: number;
}

/**
 * Splits `/proc/<pid>/smaps` into guest RAM (the mapping of `memPathPart`), the TCG translation
 * buffer (the one anonymous mapping of `tbMib` MiB or the nearest above, as QEMU rounds it),
 * the heap, other anonymous memory and libraries.
 */
export function qemuMemory(pid: number, memPathPart: string, tbMib: number): QemuMemory {
  const out: QemuMemory = {
    guest_ram_rss_mib: 0,
    guest_ram_anon_mib: 0,
    tcg_buffer_rss_mib: 0,
    tcg_buffer_huge_mib: 0,
    heap_rss_mib: 0,
    other_anon_mib: 0,
    libraries_pss_mib: 0,
    total_pss_mib: 0,
  };
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/smaps`, 'utf8');
  } catch {
    return out;
  }
  const blocks = text.split(/\n(?=[0-9a-f]+-[0-9a-f]+ )/);
  const maps = blocks.map((b) => {
    const [head = ''] = b.split('\n', 1);
    const [range = '0-0', , , , , path = ''] = head.split(/\s+/);
    const [lo, hi] = range.split('-').map((x) => parseInt(x, 16));
    const kb = (f: string): number => Number(new RegExp(`^${f}:\\s+(\\d+) kB`, 'm').exec(b)?.[1]);
    return {
      sizeMib: (hi! - lo!) / 1048576,
      path,
      rss: kb('Rss') / 1024,
      pss: kb('Pss') / 1024,
      anon: kb('Anonymous') / 1024,
      huge: kb('AnonHugePages') / 1024,
    };
  });
  // The translation buffer: the anonymous mapping closest in size to tb-size (QEMU adds a
  // guard page and may split it into per-thread regions, all inside one mapping).
  let tb = -1;
  maps.forEach((m, i) => {
    if (m.path !== '' || m.sizeMib < tbMib * 0.9 || m.sizeMib > tbMib * 1.2 + 2) return;
    if (tb < 0 || m.rss > maps[tb]!.rss) tb = i;
  });
  maps.forEach((m, i) => {
    out.total_pss_mib += m.pss || 0;
    if (m.path.includes(memPathPart)) {
      out.guest_ram_rss_mib += m.rss;
      out.guest_ram_anon_mib += m.anon;
    } else if (i === tb) {
      out.tcg_buffer_rss_mib += m.rss;
      out.tcg_buffer_huge_mib += m.huge;
    } else if (m.path === '[heap]') out.heap_rss_mib += m.rss;
    else if (m.path === '' || m.path.startsWith('[')) out.other_anon_mib += m.anon || 0;
    else out.libraries_pss_mib += m.pss || 0;
  });
  for (const k of Object.keys(out) as (keyof QemuMemory)[]) out[k] = round1(out[k]);
  return out;
}

export const round1 = (x: number): number => Math.round(x * 10) / 10;

/** MemAvailable of the host in MiB. */
export function memAvailableMib(): number {
  const m = /^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** The machine the figures were measured on, so runs on different hosts can be compared. */
export function machineInfo(): Record<string, string | number> {
  const cpuinfo = readFileSync('/proc/cpuinfo', 'utf8');
  const mhz = /^cpu MHz\s*:\s*([\d.]+)/m.exec(cpuinfo)?.[1];
  const memTotal = /^MemTotal:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1];
  return {
    cpu_model: /^model name\s*:\s*(.*)$/m.exec(cpuinfo)?.[1]?.trim() ?? 'unknown',
    cpu_mhz: mhz ? Math.round(Number(mhz)) : 0,
    cpu_cores: cpus().length,
    host_mem_total_mib: memTotal ? Math.round(Number(memTotal) / 1024) : 0,
    load_at_start: loadAverage(),
    thp_mode:
      /\[(\w+)\]/.exec(readOr('/sys/kernel/mm/transparent_hugepage/enabled'))?.[1] ?? 'unknown',
    ksm_run_at_start: readOr('/sys/kernel/mm/ksm/run').trim() || 'unknown',
  };
}

/** A file's text, or '' when it cannot be read (a kernel without the feature). */
export function readOr(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** The 1-minute load average, two decimals: noted beside CPU-time sensitive figures. */
export function loadAverage(): number {
  return Math.round(loadavg()[0]! * 100) / 100;
}
