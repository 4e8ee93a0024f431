/**
 * Issue 15's density figures: N sandboxes that have each run one exec, kept alive together.
 * Host memory per sandbox is the growth of the summed PSS of this hostd's QEMUs (which counts a
 * page shared by k VMs as 1/k to each, so the template image is counted once), plus hostd's own
 * RSS growth: unlike MemAvailable, which is reported beside it, it does not move with other
 * processes on a shared machine. Idle CPU and exec latency are taken with the N sandboxes alive.
 */
import { readdirSync } from 'node:fs';
import { Agent } from 'node:http';
import { findProcessesUsing } from '../src/state-dir.js';
import { sandboxQemuPid, type Api, type Hostd } from '../testkit/hostd.js';
import { forkStandbySettled, noExecRunning, poolHolds } from '../testkit/metrics.js';
import { createSandbox } from '../testkit/sandboxes.js';
import {
  cpuMs,
  loadAverage,
  memAvailableMib,
  pssMib,
  qemuMemory,
  readOr,
  round1,
  rssMib,
} from './proc-stats.js';
import { exec, execHttp, pct, stdoutOf, type Results } from './util.js';

export interface DensityOptions {
  /** Sandboxes kept alive together (the issue names 100). */
  n: number;
  /** The pool size hostd was started with, to wait for a host at rest. */
  poolSize: number;
  /** TCG translation buffer size hostd gives each VM, to find it in smaps. */
  tbMib: number;
  /** Seconds over which idle CPU is sampled. */
  idleSeconds: number;
  /** At most this long is waited for KSM's passes before memory is read. */
  ksmSettleMaxSeconds: number;
}

/** KSM's count of completed passes over mergeable memory (null without KSM). */
function ksmFullScans(): number | null {
  if (readOr('/sys/kernel/mm/ksm/run').trim() !== '1') return null;
  return Number(readOr('/sys/kernel/mm/ksm/full_scans').trim());
}

/** The kernel's KSM thread, whose CPU the merging costs (not part of any QEMU's). */
function ksmdPid(): number | null {
  for (const entry of readdirSync('/proc')) {
    if (/^\d+$/.test(entry) && readOr(`/proc/${entry}/comm`).trim() === 'ksmd') {
      return Number(entry);
    }
  }
  return null;
}

/**
 * Waits until KSM has made `passes` full passes since `from`, at most `maxSeconds`; returns the
 * seconds waited. A page is merged on the pass after the one that first saw it unchanged, and
 * the pass under way at `from` may have gone by a page before it was written: three passes.
 */
async function ksmSettled(
  from: number | null,
  passes: number,
  maxSeconds: number,
): Promise<number> {
  const t0 = performance.now();
  if (from === null) return 0;
  while ((ksmFullScans() ?? from) < from + passes) {
    if (performance.now() - t0 > maxSeconds * 1000) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  return round1((performance.now() - t0) / 1000);
}

/** Pages of process `pid` that KSM has merged (0 without KSM or on older kernels). */
function ksmMergingPages(pid: number): number {
  return Number(readOr(`/proc/${pid}/ksm_merging_pages`).trim()) || 0;
}

const VARIED_CODE = [
  'import subprocess, sys, time',
  't = time.perf_counter()',
  'mods = "json, re, decimal, email.mime.multipart, http.client, xml.dom.minidom, argparse, asyncio, sqlite3, unittest, csv, statistics"',
  'subprocess.run([sys.executable, "-c", "import " + mods], check=True)',
  'print((time.perf_counter() - t) * 1000)',
].join('\n');

/** Host memory that must stay free in `max_active_sandboxes_24gib` (issue 15: 2 GiB). */
const RESERVE_MIB = 2048;

export async function densityFigures(c: Api, hostd: Hostd, o: DensityOptions): Promise<Results> {
  const atRest = async (): Promise<void> => {
    await noExecRunning(c);
    await poolHolds(c, 'python', o.poolSize);
    await forkStandbySettled(c);
  };
  const qemuPssTotal = async (): Promise<number> => {
    let sum = 0;
    for (const pid of await findProcessesUsing(hostd.stateDir)) sum += pssMib(pid);
    return sum;
  };
  const hostdPid = hostd.proc.pid!;
  await atRest();
  const pssBefore = await qemuPssTotal();
  const hostdBefore = rssMib(hostdPid);
  const availBefore = memAvailableMib();
  /** Host memory per sandbox: QEMUs' summed PSS growth plus hostd's RSS growth, over n. */
  const perSandboxMib = async (): Promise<number> =>
    ((await qemuPssTotal()) - pssBefore + (rssMib(hostdPid) - hostdBefore)) / o.n;

  const ids: string[] = [];
  const agent = new Agent({ keepAlive: true, maxSockets: 4 });
  try {
    for (let i = 0; i < o.n; i++) {
      const id = await createSandbox(c);
      ids.push(id);
      await execHttp(c, agent, id, `x = ${i}\nprint(x)`);
    }
    await atRest();
    const pids = await Promise.all(ids.map((id) => sandboxQemuPid(hostd, id)));
    const scansAtCreate = ksmFullScans();
    // What the N cost the moment they exist, before KSM merged what they wrote alike.
    const atCreate = await perSandboxMib();

    // Idle CPU: the N sandboxes' QEMUs over a quiet window, as % of one core per 100 sandboxes.
    // KSM's own thread is reported beside it: it runs for the host, not in any QEMU.
    const ksmd = ksmdPid();
    const cpu0 = pids.reduce((a, p) => a + cpuMs(p), 0);
    const hostdCpu0 = cpuMs(hostdPid);
    const ksmdCpu0 = ksmd === null ? 0 : cpuMs(ksmd);
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, o.idleSeconds * 1000));
    const windowMs = performance.now() - t0;
    const cpuUsed = pids.reduce((a, p) => a + cpuMs(p), 0) - cpu0;
    const hostdCpu = cpuMs(hostdPid) - hostdCpu0;
    const ksmdCpu = ksmd === null ? 0 : cpuMs(ksmd) - ksmdCpu0;

    // Exec round trips on one sandbox while the others idle.
    const times: number[] = [];
    const single = new Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < 220; i++) {
      const t = performance.now();
      await execHttp(c, single, ids[0]!, 'print(1)');
      if (i >= 20) times.push(performance.now() - t);
    }
    single.destroy();

    // Memory last, in the steady state of sandboxes that idle: KSM (when on) merges the pages
    // they wrote alike over its next passes, which take ~30 s each at its default rate for 100.
    const ksmSettleS = await ksmSettled(scansAtCreate, 3, o.ksmSettleMaxSeconds);
    const perSandbox = await perSandboxMib();
    const availAfter = memAvailableMib();
    const one = qemuMemory(pids[0]!, hostd.dataDir, o.tbMib);
    const ksmMerged = pids.reduce((a, p) => a + ksmMergingPages(p), 0);

    // Code the VM has not run yet: a fresh interpreter importing modules, timed in the guest.
    // A small translation buffer shows here first (TCG flushes it when full and retranslates).
    const varied: number[] = [];
    for (let i = 0; i < 3; i++) {
      varied.push(Number(stdoutOf(await exec(c, ids[1] ?? ids[0]!, VARIED_CODE)).trim()));
    }

    return {
      density_sandboxes: o.n,
      density_load: loadAverage(),
      active_sandbox_host_mib: round1(perSandbox),
      active_sandbox_host_mib_at_create: round1(atCreate),
      ksm_settle_s: ksmSettleS,
      active_sandbox_memavailable_mib: round1((availBefore - availAfter) / o.n),
      max_active_sandboxes_24gib: Math.floor((24 * 1024 - RESERVE_MIB) / perSandbox),
      idle_cpu_pct_per_100_sandboxes:
        Math.round((cpuUsed / windowMs) * 100 * (100 / o.n) * 100) / 100,
      idle_hostd_cpu_pct: Math.round((hostdCpu / windowMs) * 100 * 100) / 100,
      idle_ksmd_cpu_pct: Math.round((ksmdCpu / windowMs) * 100 * 100) / 100,
      exec_print_p50_ms_100_idle: pct(times, 50),
      exec_print_p99_ms_100_idle: pct(times, 99),
      exec_new_code_ms: pct(varied, 50),
      ksm_merged_mib_per_sandbox: round1((ksmMerged * 4) / 1024 / o.n),
      ...Object.fromEntries(Object.entries(one).map(([k, v]) => [`qemu_${k}`, v])),
    };
  } finally {
    agent.destroy();
    await Promise.all(ids.map((id) => c.request('DELETE', `/v1/sandboxes/${id}`)));
  }
}
