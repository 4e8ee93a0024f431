/**
 * `npm run bench`: measures hostd against its targets (issues 11 to 15), prints a table and
 * writes bench/results/latest.json. Speeds are measured here, never asserted in tests: tests
 * check behaviour, this file says how fast it is. Every run starts with the machine (CPU model,
 * cores, load, THP and KSM state) and a no-VM baseline (`baseline_no_vm_ms`: a fixed loop in the
 * host's python3), so runs on different machines can be compared.
 *
 * Parts (`BENCH_PARTS`, comma-separated, all by default): core (create, exec, streaming), fork
 * (fork.ts), density (density.ts, `BENCH_DENSITY_N` sandboxes, 100), features (files, rich
 * outputs, network, templates, snapshots, pause, restarts: features.ts, files-net.ts, state.ts;
 * each prints `skipped: <why>` while hostd does not serve its routes), compute (compute.ts: a
 * chart, a matrix product, sklearn's first import and a DataFrame workload in the guest beside
 * Debian's python3 on the host, bench/native.ts), e2b (e2b.ts: E2B's SDKs'
 * runCode and commands.run beside the native exec), soak (soak.ts), isolation
 * (isolation.ts: a noisy neighbour's effect on another sandbox, and the per-VM jail's cost, on
 * two hostds of its own started after the main one has stopped), cluster (cluster.ts: creates
 * through HAProxy, a forwarded exec's cost, a lost node's detection, on a 3-node cluster of its
 * own, after the isolation part). Where a figure is measured on
 * less than the issue names to keep the run under 10 minutes (a 64 MiB transfer for 256, 8
 * sandboxes restarted for 32), the output says so beside it.
 *
 * Environment:
 * - `SERVICE_HOSTD_URL`: measure the hostd serving there (with `SERVICE_API_KEY` if it needs
 *   a key) instead of starting one; its E2B front (the e2b part) at `E2B_API_URL`, with
 *   `E2B_API_KEY` (else `SERVICE_API_KEY`). Figures that need hostd's processes or logs
 *   (`template_boot_ms`, `create_pool_miss_p50_ms`, the fork memory and density figures) are
 *   then null or left out.
 * - Without it, the bench starts its own hostd (the python template built, as `npm run bench`
 *   does first): a pool of 4, plus a `cold` pool of the same build with no VMs, for pool misses.
 * - `BENCH_ISOLATION_TEMPLATE` (python-slim) and `BENCH_ISOLATION_PHASE_S` (10): the template
 *   the isolation part's hostds serve, and how long each noisy cell runs before its timeout.
 * - `BENCH_KSM_SETTLE_MAX_S` (600): the longest the density part waits for KSM's three passes
 *   before it reads memory. With all of QEMU mergeable (`SERVICE_KSM_SCOPE=qemu`) a pass over
 *   30 sandboxes took ~40 s at the kernel's default rate (guest RAM alone: ~2 s), so 90 s, the
 *   earlier cap, read a host still merging.
 *
 * Every wait is on a condition hostd reports (a pool refilled, the fork standby settled, no
 * exec running, a deleted VM's process gone), so samples are taken on a host at rest.
 */
import { spawn, spawnSync } from 'node:child_process';
import { Agent } from 'node:http';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { Readable, Writable } from 'node:stream';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  connect,
  processGone,
  sandboxQemuPid,
  startHostd,
  type Api,
  type Hostd,
} from '../testkit/hostd.js';
import { ROOT } from '../testkit/root.js';
import { openExec } from '../testkit/exec.js';
import { forkStandbySettled, metricsText, poolHolds } from '../testkit/metrics.js';
import { createSandbox, untilSandbox } from '../testkit/sandboxes.js';
import { runSoak } from './soak.js';
import { forkLatency, forkMemory } from './fork.js';
import { densityFigures } from './density.js';
import { COMPUTE_FIGURES, computeFigures } from './compute.js';
import { featureFigures } from './features.js';
import { E2B_FIGURES, e2bFigures } from './e2b.js';
import { guarded } from './skip.js';
import { ISOLATION_FIGURES, isolationFigures } from './isolation.js';
import { CLUSTER_FIGURES, clusterFigures } from './cluster.js';
import { DEFAULT_TCG_TB_MIB } from '../src/config.js';
import { hostWakeBaselines } from './host-wake.js';
import { cpuMs, loadAverage, machineInfo } from './proc-stats.js';
import { baselineRatios } from './ratios.js';
import { createHttp, exec, execHttp, now, pct, type Results } from './util.js';

async function del(c: Api, id: string): Promise<void> {
  await c.request('DELETE', `/v1/sandboxes/${id}`);
}

/**
 * Deletes a sandbox and, on our own hostd, waits until its QEMU has exited, so that the next
 * sample does not share the CPU with a VM being torn down.
 */
async function delAndSettle(c: Api, hostd: Hostd | null, id: string): Promise<void> {
  const pid = hostd ? await sandboxQemuPid(hostd, id) : null;
  await del(c, id);
  if (pid !== null) await processGone("a deleted sandbox's QEMU", pid);
}

async function accelOf(c: Api): Promise<string> {
  return /hostd_info\{accel="(\w+)"/.exec(await metricsText(c))?.[1] ?? 'unknown';
}

/** The template's boot time from hostd's structured start-up log (its fields, not its text). */
function templateBootMs(hostd: Hostd | null, template: string): number | null {
  for (const line of hostd?.logs ?? []) {
    try {
      const entry = JSON.parse(line) as { template?: unknown; bootMs?: unknown };
      if (entry.template === template && typeof entry.bootMs === 'number') return entry.bootMs;
    } catch {
      /* not one of pino's lines */
    }
  }
  return null;
}

/**
 * How fast this host runs plain Python without a VM (a fixed loop in the host's python3), so
 * runs on different machines can be compared: divide a VM figure by it.
 */
function baselineNoVm(): number {
  const r = spawnSync('python3', [
    '-c',
    'import time\nt = time.perf_counter()\nsum(i * i for i in range(2_000_000))\nprint((time.perf_counter() - t) * 1000)',
  ]);
  return Math.round(Number(r.stdout.toString().trim()) * 10) / 10;
}

/**
 * Round trip of print(1) to the same REPL worker, started by the guest agent, running locally
 * over a pipe: the floor.
 */
async function baselineLocalRepl(iterations: number): Promise<number> {
  const work = mkdtempSync(join(tmpdir(), 'hostd-bench-'));
  // fd 3 and fd 4 stand for the hostd.repl port: the worker reads one and writes the other.
  const agent = spawn(
    'python3',
    [
      join(ROOT, 'guest/agent/agent.py'),
      '--stdio',
      '--no-system',
      '--workdir',
      work,
      '--repl-fds',
      '3,4',
    ],
    { stdio: ['pipe', 'pipe', 'inherit', 'pipe', 'pipe'] },
  );
  const toRepl = agent.stdio[3] as Writable;
  const fromRepl = agent.stdio[4] as Readable;
  let buf = '';
  let waiter: ((line: string) => void) | null = null;
  fromRepl.setEncoding('utf8');
  fromRepl.on('data', (chunk: string) => {
    buf += chunk;
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      waiter?.(line);
    }
  });
  // An agent that exits (a bad argument, say) must fail the bench, not hang it
  let exitedEarly: Error | null = null;
  const onEarlyExit = (code: number | null): void => {
    exitedEarly = new Error(`the local agent exited (code ${code})`);
    waiter?.('');
  };
  agent.once('exit', onEarlyExit);
  const roundTrip = (id: number): Promise<void> =>
    new Promise((resolveRt, rejectRt) => {
      waiter = (line) => {
        if (exitedEarly) rejectRt(exitedEarly);
        else if (line.includes('"op":"exit"')) resolveRt();
      };
      toRepl.write(JSON.stringify({ op: 'exec', id, code: 'print(1)' }) + '\n');
    });
  const times: number[] = [];
  for (let i = 0; i < iterations + 20; i++) {
    const t = now();
    await roundTrip(i + 1);
    if (i >= 20) times.push(now() - t);
  }
  // Closing stdin makes the agent kill the worker and exit
  agent.off('exit', onEarlyExit);
  const exited = new Promise((r) => agent.once('exit', r));
  agent.stdin?.end();
  await exited;
  fromRepl.destroy();
  toRepl.destroy();
  rmSync(work, { recursive: true, force: true });
  return pct(times, 50);
}

/**
 * `BENCH_PARTS` (comma-separated) runs only some parts: core (create, exec, streaming), fork
 * (latency, CPU and memory per child), density (issue 15, `BENCH_DENSITY_N` sandboxes, 100 by
 * default), features (files, network, templates, snapshots, pause: skipped while hostd answers
 * route_not_found), compute (issue 29), e2b (issue 24: E2B's SDKs against the native API),
 * soak, isolation (issue 27: needs root for the jail
 * figures), cluster (issue 25: etcd and HAProxy from setup). All by default.
 */
const parts = new Set(
  (process.env.BENCH_PARTS || 'core,fork,density,features,compute,e2b,soak,isolation,cluster')
    .split(',')
    .map((p) => p.trim()),
);

/** The parts measured on one hostd (ours, or the one at SERVICE_HOSTD_URL). */
async function mainParts(client: Api, hostd: Hostd | null, results: Results): Promise<void> {
  // Our own hostd has a pool of 4; another's: wait for at least 1.
  const poolFull = (): Promise<void> => poolHolds(client, 'python', hostd ? 4 : 1);
  results.accelerator = await accelOf(client);
  results.template_boot_ms = templateBootMs(hostd, 'python');

  // Pool hits: wait until the pool is full again before each create, so each sample is a
  // hand-over on a host that is not busy restoring the previous refill.
  // hostd's start-up work includes copying each template's image for forks: let it end.
  // Fork figures are for a host at rest too: back-to-back forks faster than hostd's refill
  // of the QEMUs it starts ahead start some children's QEMUs from scratch.
  await forkStandbySettled(client);
  if (parts.has('core')) {
    // 40 through a keep-alive node:http client, as the TypeScript SDK sends them (the figure),
    // and 20 through fetch between them, as testkit's helpers do (reported beside it).
    const hits: number[] = [];
    const fetchedHits: number[] = [];
    const createAgent = new Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < 60; i++) {
      await poolFull();
      const viaFetch = i % 3 === 2;
      const t = now();
      const id = viaFetch ? await createSandbox(client) : await createHttp(client, createAgent);
      (viaFetch ? fetchedHits : hits).push(now() - t);
      await delAndSettle(client, hostd, id);
    }
    createAgent.destroy();
    results.create_pool_hit_p50_ms = pct(hits, 50);
    results.create_pool_hit_p99_ms = pct(hits, 99);
    results.create_pool_hit_fetch_p50_ms = pct(fetchedHits, 50);

    // Pool misses: the `cold` template has no pool, so every create restores a VM.
    const misses: number[] = [];
    for (let i = 0; i < 10; i++) {
      const t = now();
      const id = await createSandbox(client, hostd ? { template: 'cold' } : {});
      misses.push(now() - t);
      await delAndSettle(client, hostd, id);
    }
    results.create_pool_miss_p50_ms = hostd ? pct(misses, 50) : null;

    // The first exec in a freshly created sandbox (what "create, then run" feels like).
    const firsts: number[] = [];
    for (let i = 0; i < 5; i++) {
      await poolFull();
      const fresh = await createSandbox(client);
      const t = now();
      await exec(client, fresh, 'print(1)');
      firsts.push(now() - t);
      await delAndSettle(client, hostd, fresh);
    }
    results.exec_first_in_new_sandbox_p50_ms = pct(firsts, 50);

    // Exec round trip of a trivial print in a warm sandbox, once the pool has refilled after
    // the create (a refill restores a VM: ~0.3 s of CPU that would land in the samples).
    const id = await createSandbox(client);
    await poolFull();
    // Through a keep-alive node:http client, which costs little itself: the figure is hostd's.
    // What a fetch() client sees is reported too (undici added ~1 ms per request here).
    const keepAlive = new Agent({ keepAlive: true, maxSockets: 1 });
    const execs: number[] = [];
    const fetched: number[] = [];
    // CPU per exec of the sandbox's QEMU (the guest's work, emulated) and of hostd: unlike the
    // round trip, little moved by other tenants' load (docs/architecture.md, "Exec latency on
    // a slow TCG host").
    const qemuPid = hostd ? await sandboxQemuPid(hostd, id) : null;
    const hostdPid = hostd?.proc.pid ?? null;
    const cpuBefore = [qemuPid, hostdPid].map((p) => (p === null ? 0 : cpuMs(p)));
    for (let i = 0; i < 300; i++) {
      let t = now();
      await execHttp(client, keepAlive, id, 'print(1)');
      if (i >= 20) execs.push(now() - t);
      t = now();
      await exec(client, id, 'print(1)');
      if (i >= 20) fetched.push(now() - t);
    }
    keepAlive.destroy();
    const [qemuCpu, hostdCpu] = [qemuPid, hostdPid].map((p, k) =>
      p === null ? null : Math.round(((cpuMs(p) - cpuBefore[k]!) / 600) * 100) / 100,
    );
    results.exec_print_p50_ms = pct(execs, 50);
    results.exec_print_p99_ms = pct(execs, 99);
    results.exec_print_fetch_p50_ms = pct(fetched, 50);
    results.exec_print_qemu_cpu_ms = qemuCpu ?? null;
    results.exec_print_hostd_cpu_ms = hostdCpu ?? null;
    results.baseline_local_repl_exec_p50_ms = await baselineLocalRepl(300);
    Object.assign(results, await streamingFigures(client, id));
    await del(client, id);
  }
  if (parts.has('e2b')) {
    const e2bUrl = hostd ? hostd.e2bUrl : (process.env.E2B_API_URL ?? '');
    const e2bKey =
      process.env.E2B_API_KEY || process.env.SERVICE_API_KEY || `e2b_${'0'.repeat(40)}`;
    Object.assign(
      results,
      await guarded(E2B_FIGURES, () => e2bFigures(client, e2bUrl, e2bKey, poolFull)),
    );
  }
  if (parts.has('fork')) Object.assign(results, await forkLatency(client, hostd));
  if (parts.has('fork') && hostd) Object.assign(results, await forkMemory(client, hostd));
  if (parts.has('density') && hostd) {
    const n = Number(process.env.BENCH_DENSITY_N ?? 100);
    const density = await densityFigures(client, hostd, {
      n,
      poolSize: 4,
      tbMib: Number(process.env.SERVICE_TCG_TB_MIB ?? 0) || DEFAULT_TCG_TB_MIB,
      idleSeconds: 15,
      ksmSettleMaxSeconds: Number(process.env.BENCH_KSM_SETTLE_MAX_S ?? 600),
    });
    Object.assign(results, density);
  }
  if (parts.has('features')) Object.assign(results, await featureFigures(client, hostd, poolFull));
  if (parts.has('compute')) {
    Object.assign(results, await guarded(COMPUTE_FIGURES, () => computeFigures(client)));
  }
  if (parts.has('soak')) {
    if (hostd) Object.assign(results, await forkMemory(client, hostd));
    Object.assign(results, await runSoak(client, { seconds: 40, hostdPid: hostd?.proc.pid }));
  }
}

async function main(): Promise<void> {
  const started = now();
  const results: Results = {};
  Object.assign(results, machineInfo());
  results.baseline_no_vm_ms = baselineNoVm();
  Object.assign(results, hostWakeBaselines());
  // The isolation part starts hostds of its own, once the main one is gone.
  if ([...parts].some((p) => p !== 'isolation' && p !== 'cluster')) {
    let hostd: Hostd | null = null;
    let client: Api;
    if (process.env.SERVICE_HOSTD_URL) {
      client = connect(process.env.SERVICE_HOSTD_URL, process.env.SERVICE_API_KEY || undefined);
    } else {
      hostd = await startHostd({
        env: {
          SERVICE_TEMPLATES: 'python,cold:recipe=python:pool=0',
          SERVICE_POOL_SIZE: '4',
          SERVICE_LOG_LEVEL: 'info',
        },
      });
      client = hostd;
    }
    try {
      await mainParts(client, hostd, results);
    } catch (err) {
      if (hostd) console.error(`hostd log tail:\n${hostd.logs.slice(-30).join('\n')}`);
      throw err;
    } finally {
      if (hostd) await hostd.stop();
    }
  }
  if (parts.has('isolation')) {
    if (process.env.SERVICE_HOSTD_URL) {
      const why = 'skipped: needs hostds of its own (SERVICE_HOSTD_URL is set)';
      for (const k of ISOLATION_FIGURES) results[k] = why;
    } else {
      Object.assign(results, await guarded(ISOLATION_FIGURES, isolationFigures));
    }
  }
  if (parts.has('cluster')) {
    if (process.env.SERVICE_HOSTD_URL) {
      const why = 'skipped: starts a cluster of its own (SERVICE_HOSTD_URL is set)';
      for (const k of CLUSTER_FIGURES) results[k] = why;
    } else {
      Object.assign(results, await guarded(CLUSTER_FIGURES, clusterFigures));
    }
  }

  results.load_at_end = loadAverage();
  // The host's speed can drift over a run (other tenants of a shared machine): compare both ends.
  results.baseline_no_vm_ms_at_end = baselineNoVm();
  Object.assign(results, baselineRatios(results));
  results.bench_seconds = Math.round((now() - started) / 1000);
  results.measured_at = new Date().toISOString();
  mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true });
  writeFileSync(
    join(ROOT, 'bench', 'results', 'latest.json'),
    JSON.stringify(results, null, 2) + '\n',
  );
  console.log('\nmetric                               value');
  for (const [k, v] of Object.entries(results)) console.log(`${k.padEnd(36)} ${v}`);
  console.log('\nwritten to bench/results/latest.json');
}

/**
 * How soon a streamed exec shows progress, on the warm sandbox `id` (p50 of 10 each): the
 * first line of a cell that goes on running, the status and headers of a cell that prints
 * nothing, how long past its `timeout` a busy cell ends, and how soon the next exec is served
 * after a client walks away from a running one. Tests only check that these things happen.
 */
async function streamingFigures(c: Api, id: string): Promise<Results> {
  const firstLine: number[] = [];
  const headers: number[] = [];
  const overrun: number[] = [];
  const afterDisconnect: number[] = [];
  for (let i = 0; i < 10; i++) {
    let t = now();
    let stream = await openExec(c, id, {
      code: 'import time\nprint("first", flush=True)\ntime.sleep(0.2)',
    });
    await stream.until('the first line', (e) => e.type === 'stdout');
    firstLine.push(now() - t);
    await stream.rest();

    t = now();
    stream = await openExec(c, id, { code: 'import time\ntime.sleep(0.2)' });
    headers.push(now() - t);
    await stream.rest();

    const timeoutS = 0.5;
    t = now();
    stream = await openExec(c, id, { code: 'while True:\n    pass', timeout: timeoutS });
    const events = await stream.rest();
    overrun.push(now() - t - timeoutS * 1000);
    if (events.at(-1)?.data !== 124) throw new Error(`timeout exec: ${JSON.stringify(events)}`);

    stream = await openExec(c, id, {
      code: 'import time\nprint("go", flush=True)\nwhile True:\n    time.sleep(60)',
    });
    await stream.until('the cell to start', (e) => e.type === 'stdout');
    t = now();
    stream.abort();
    await exec(c, id, 'print(1)');
    afterDisconnect.push(now() - t);
    await untilSandbox(c, id, 'the sandbox to be idle', (s) => !s.busy);
  }
  return {
    exec_first_line_p50_ms: pct(firstLine, 50),
    exec_silent_headers_p50_ms: pct(headers, 50),
    exec_timeout_overrun_p50_ms: pct(overrun, 50),
    exec_next_after_disconnect_p50_ms: pct(afterDisconnect, 50),
  };
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
