/**
 * Issue 27's figures: what one sandbox's abuse does to another's latency, and what the per-VM
 * jail (docs/operations.md, Security) costs.
 *
 * - Noisy neighbour: sandbox B runs `print(1)` back to back while sandbox A runs, in turn, a
 *   CPU spinner, a fork bomb, a memory hog and all three together, each stopped by its exec
 *   timeout so the run ends; beside it the same loop with A idle. Reported on the fully jailed
 *   hostd (`noisy_neighbor_*`, `quiet_neighbor_*`), and on the uid-only one with a `jail_uid_`
 *   prefix, which shows what the cgroup leaf adds.
 * - Jail cost: two hostds started side by side from the same template, one with
 *   `SERVICE_VM_JAIL=full` (the default), one with `SERVICE_VM_JAIL=uid` (only the per-VM uid:
 *   no namespaces, no keeper process, no cgroup leaf). Creates that start a QEMU (a template
 *   with no pool) and 8-way forks alternate between the two, so drifting load on a shared host
 *   falls on both alike; memory is the growth of host PSS of every QEMU and jail keeper of both
 *   hostds (a library page shared across them is counted once however it is split) plus the
 *   hostd's own RSS growth, per sandbox. Unjailed QEMUs cannot be measured beside them: as root
 *   hostd always gives each QEMU at least its uid, and as any other user it has no jail at all.
 *
 * Each hostd serves `BENCH_ISOLATION_TEMPLATE` (python-slim: nothing here needs the data stack).
 */
import { Agent } from 'node:http';
import { findProcessesUsing } from '../src/state-dir.js';
import { processGone, sandboxQemuPid, startHostd, type Api, type Hostd } from '../testkit/hostd.js';
import { openExec } from '../testkit/exec.js';
import { forkStandbySettled, noExecRunning, poolHolds } from '../testkit/metrics.js';
import { createSandbox, untilSandbox } from '../testkit/sandboxes.js';
import { loadAverage, pssMib, readOr, round1, rssMib } from './proc-stats.js';
import { exec, execHttp, now, pct, type Results } from './util.js';

const TEMPLATE = process.env.BENCH_ISOLATION_TEMPLATE || 'python-slim';

/** Seconds each noisy cell runs before its exec timeout stops it (and the quiet window). */
const PHASE_S = Number(process.env.BENCH_ISOLATION_PHASE_S ?? 10);

/**
 * What sandbox A runs, as bash (stderr dropped: a fork bomb's "retry" lines would otherwise
 * fill the output cap and end the cell early). Each runs until its exec's timeout.
 */
const SPINNER = 'for i in 1 2 3 4 5 6 7 8; do (while :; do :; done) & done; wait';
const FORK_BOMB = 'exec 2>/dev/null; bomb() { bomb | bomb & }; bomb; sleep 600';
/** A hog that the guest's OOM killer kills, started again at once: memory pressure throughout. */
const MEMORY_HOG =
  'exec 2>/dev/null; while :; do python3 -c "a = []\nwhile True: a.append(bytearray(10**7))"; done';
const ALL_THREE = `(${SPINNER}) & (${MEMORY_HOG}) & ${FORK_BOMB}`;

const NOISES: [name: string, code: string][] = [
  ['spinner', SPINNER],
  ['fork_bomb', FORK_BOMB],
  ['memory_hog', MEMORY_HOG],
  ['all', ALL_THREE],
];

/** Every figure isolationFigures reports, for `guarded`. */
export const ISOLATION_FIGURES = [
  'isolation_template',
  'quiet_neighbor_exec_p50_ms',
  'quiet_neighbor_exec_p99_ms',
  'noisy_neighbor_exec_p50_ms',
  'noisy_neighbor_exec_p99_ms',
  ...NOISES.map(([n]) => `noisy_neighbor_${n}_exec_p99_ms`),
  'noisy_neighbor_exec_errors',
  'noisy_neighbor_exits',
  'jail_uid_quiet_neighbor_exec_p99_ms',
  'jail_uid_noisy_neighbor_exec_p50_ms',
  'jail_uid_noisy_neighbor_exec_p99_ms',
  'jail_full_cgroup_leaf',
  'jail_full_create_pool_miss_p50_ms',
  'jail_uid_create_pool_miss_p50_ms',
  'jail_full_fork_n8_ms',
  'jail_uid_fork_n8_ms',
  'jail_full_sandbox_host_mib',
  'jail_uid_sandbox_host_mib',
  'jail_keeper_pss_mib',
  'isolation_load',
];

const del = async (c: Api, id: string): Promise<void> => {
  await c.request('DELETE', `/v1/sandboxes/${id}`);
};

/** Deletes a sandbox and waits until its QEMU has exited, so the next sample runs at rest. */
async function delAndSettle(h: Hostd, id: string): Promise<void> {
  const pid = await sandboxQemuPid(h, id);
  await del(h, id);
  await processGone("a deleted sandbox's QEMU", pid);
}

/** The parent of `pid` when it is a jail's keeper (`unshare`), else null. */
function keeperOf(pid: number): number | null {
  const stat = readOr(`/proc/${pid}/stat`);
  const ppid = Number(stat.split(') ')[1]?.split(' ')[1]);
  if (!ppid || readOr(`/proc/${ppid}/comm`).trim() !== 'unshare') return null;
  return ppid;
}

/** Summed PSS of the QEMUs of these hostds and their jails' keepers, and the keepers' alone. */
async function vmProcessesPss(hostds: Hostd[]): Promise<{ total: number; keepers: number }> {
  let total = 0;
  let keepers = 0;
  for (const h of hostds) {
    for (const pid of await findProcessesUsing(h.stateDir)) {
      total += pssMib(pid);
      const keeper = keeperOf(pid);
      if (keeper !== null) keepers += pssMib(keeper);
    }
  }
  return { total: total + keepers, keepers };
}

/** A hostd's background work is done: no exec, the pool full, the fork standby started. */
async function atRest(h: Hostd): Promise<void> {
  await noExecRunning(h);
  await poolHolds(h, TEMPLATE, 1);
  await forkStandbySettled(h);
}

/**
 * print(1) round trips on sandbox `b` until `until` has settled (a noisy cell), or for `until`
 * seconds. A round trip that fails (its own 30 s timeout, an error) is counted, not timed.
 */
async function sampleExecs(
  c: Api,
  b: string,
  until: Promise<unknown> | number,
): Promise<{ times: number[]; errors: number }> {
  let settled = false;
  const end = typeof until === 'number' ? now() + until * 1000 : Infinity;
  if (typeof until !== 'number') {
    // Its outcome is read by whoever awaits it; here only that it has ended.
    until.then(
      () => (settled = true),
      () => (settled = true),
    );
  }
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const times: number[] = [];
  let errors = 0;
  try {
    while (!settled && now() < end) {
      const t = now();
      try {
        await execHttp(c, agent, b, 'print(1)', { timeout: 30 });
        times.push(now() - t);
      } catch {
        errors++;
      }
    }
  } finally {
    agent.destroy();
  }
  return { times, errors };
}

/** Runs `code` (bash) in sandbox `a` with the phase's timeout; resolves to its exit code. */
async function noisyCell(c: Api, a: string, code: string): Promise<number> {
  const stream = await openExec(c, a, { code, language: 'bash', timeout: PHASE_S });
  const events = await stream.rest();
  return Number(events.find((e) => e.type === 'exit')?.data ?? NaN);
}

/**
 * Sandbox B's print(1) latency with A quiet, then while A runs each noise in turn. The noisy
 * cells end by their timeout (124); A must answer print(1) again after each.
 */
async function neighbourFigures(h: Hostd, prefix: string): Promise<Results> {
  const a = await createSandbox(h);
  const b = await createSandbox(h);
  try {
    await exec(h, a, 'print(1)');
    await exec(h, b, 'print(1)');
    await atRest(h);
    await sampleExecs(h, b, 2); // warm-up: B's first round trips after a create are slower
    const quiet = await sampleExecs(h, b, PHASE_S);
    const results: Results = {
      [`${prefix}quiet_neighbor_exec_p50_ms`]: pct(quiet.times, 50),
      [`${prefix}quiet_neighbor_exec_p99_ms`]: pct(quiet.times, 99),
    };
    const noisy: number[] = [];
    const exits: string[] = [];
    let errors = quiet.errors;
    for (const [name, code] of NOISES) {
      const cell = noisyCell(h, a, code);
      const s = await sampleExecs(h, b, cell);
      exits.push(`${name}:${await cell}`);
      noisy.push(...s.times);
      errors += s.errors;
      results[`${prefix}noisy_neighbor_${name}_exec_p99_ms`] = pct(s.times, 99);
      await untilSandbox(h, a, 'the noisy sandbox to be idle', (s) => !s.busy);
      await exec(h, a, 'print(1)'); // A itself survived its own noise
    }
    results[`${prefix}noisy_neighbor_exec_p50_ms`] = pct(noisy, 50);
    results[`${prefix}noisy_neighbor_exec_p99_ms`] = pct(noisy, 99);
    results[`${prefix}noisy_neighbor_exec_errors`] = errors;
    results[`${prefix}noisy_neighbor_exits`] = exits.join(',');
    return results;
  } finally {
    await Promise.all([del(h, a), del(h, b)]);
  }
}

/** Starts a hostd as root with the jail `mode`, in a uid range of its own. */
function startJailed(mode: 'full' | 'uid', uidRange: string): Promise<Hostd> {
  return startHostd({
    env: {
      SERVICE_TEMPLATES: `${TEMPLATE}:pool=1,cold:recipe=${TEMPLATE}:pool=0`,
      SERVICE_POOL_SIZE: '1',
      SERVICE_VM_JAIL: mode,
      // Two hostds as root on one host: each hands out uids (and cgroup leaves named after them)
      // from a range the other does not use.
      SERVICE_VM_UID_RANGE: uidRange,
      SERVICE_LOG_LEVEL: 'info',
    },
  });
}

/** True when the QEMU `pid` is in a per-VM cgroup leaf (`hostd-vms/vm-<uid>`). */
function inLeaf(pid: number): boolean {
  return readOr(`/proc/${pid}/cgroup`).includes('/hostd-vms/');
}

/**
 * The jail cost: pool-miss creates and 8-way forks alternating between the two hostds, then
 * host memory per sandbox of 8 sandboxes on each in turn.
 */
async function jailCost(full: Hostd, uid: Hostd): Promise<Results> {
  const pair: [string, Hostd][] = [
    ['jail_full_', full],
    ['jail_uid_', uid],
  ];
  const results: Results = {};
  // Creates that start a QEMU: the jail's setup is on the request's path.
  const creates = new Map<Hostd, number[]>([
    [full, []],
    [uid, []],
  ]);
  for (let i = 0; i < 10; i++) {
    // Alternating which goes first too: neither always follows the other's teardown.
    for (const [, h] of i % 2 ? [...pair].reverse() : pair) {
      await atRest(h);
      const t = now();
      const id = await createSandbox(h, { template: 'cold' });
      creates.get(h)!.push(now() - t);
      if (h === full && i === 0)
        results.jail_full_cgroup_leaf = inLeaf(await sandboxQemuPid(h, id)) ? 'yes' : 'no';
      await delAndSettle(h, id);
    }
  }
  for (const [p, h] of pair) results[`${p}create_pool_miss_p50_ms`] = pct(creates.get(h)!, 50);

  // Forks: children come from QEMUs hostd started ahead (the fork standby), as users see them.
  const parents = new Map<Hostd, string>();
  for (const [, h] of pair) {
    const id = await createSandbox(h);
    await exec(h, id, 'x = 1\nprint(x)');
    parents.set(h, id);
  }
  const forks = new Map<Hostd, number[]>([
    [full, []],
    [uid, []],
  ]);
  for (let r = 0; r < 5; r++) {
    for (const [, h] of r % 2 ? [...pair].reverse() : pair) {
      await atRest(h);
      const t = now();
      const res = await h.request('POST', `/v1/sandboxes/${parents.get(h)!}/fork`, { n: 8 });
      const body = (await res.json()) as { children?: { id: string }[]; error?: string };
      forks.get(h)!.push(now() - t);
      if (!body.children) throw new Error(`fork 8: ${res.status} ${body.error}`);
      await Promise.all(body.children.map((ch) => delAndSettle(h, ch.id)));
    }
  }
  for (const [p, h] of pair) {
    results[`${p}fork_n8_ms`] = pct(forks.get(h)!, 50);
    await del(h, parents.get(h)!);
  }

  // Memory: 8 sandboxes that each ran one exec, on one hostd at a time.
  const n = 8;
  for (const [p, h] of pair) {
    await Promise.all([atRest(full), atRest(uid)]);
    const before = await vmProcessesPss([full, uid]);
    const hostdBefore = rssMib(h.proc.pid!);
    const ids: string[] = [];
    try {
      for (let i = 0; i < n; i++) {
        const id = await createSandbox(h);
        ids.push(id);
        await exec(h, id, `x = ${i}\nprint(x)`);
      }
      await Promise.all([atRest(full), atRest(uid)]);
      const after = await vmProcessesPss([full, uid]);
      const grown = after.total - before.total + (rssMib(h.proc.pid!) - hostdBefore);
      results[`${p}sandbox_host_mib`] = round1(grown / n);
      if (h === full) results.jail_keeper_pss_mib = round1((after.keepers - before.keepers) / n);
    } finally {
      await Promise.all(ids.map((id) => delAndSettle(h, id)));
    }
  }
  return results;
}

/**
 * Both parts on two hostds of their own, started side by side. Without root there is no jail
 * to measure: the noisy neighbour is measured on one unjailed hostd and the jail figures say
 * why they are missing.
 */
export async function isolationFigures(): Promise<Results> {
  const results: Results = { isolation_template: TEMPLATE };
  if (process.getuid?.() !== 0) {
    const h = await startHostd({
      env: { SERVICE_TEMPLATES: `${TEMPLATE}:pool=1`, SERVICE_POOL_SIZE: '1' },
    });
    try {
      Object.assign(results, await neighbourFigures(h, ''));
    } finally {
      await h.stop();
    }
    const why = 'skipped: hostd jails QEMUs only when it runs as root';
    for (const k of ISOLATION_FIGURES) if (k.startsWith('jail_')) results[k] = why;
    results.isolation_load = loadAverage();
    return results;
  }
  const started = await Promise.allSettled([
    startJailed('full', '210000-219999'),
    startJailed('uid', '220000-229999'),
  ]);
  const failed = started.find((s) => s.status === 'rejected');
  if (failed) {
    // The other one must not be left running (with its VMs) when one did not start.
    for (const s of started) if (s.status === 'fulfilled') await s.value.stop();
    throw failed.reason;
  }
  const [full, uid] = started.map((s) => (s as PromiseFulfilledResult<Hostd>).value) as [
    Hostd,
    Hostd,
  ];
  try {
    Object.assign(results, await jailCost(full, uid));
    Object.assign(results, await neighbourFigures(full, ''));
    const u = await neighbourFigures(uid, 'jail_uid_');
    for (const k of [
      'jail_uid_quiet_neighbor_exec_p99_ms',
      'jail_uid_noisy_neighbor_exec_p50_ms',
      'jail_uid_noisy_neighbor_exec_p99_ms',
    ]) {
      results[k] = u[k] ?? null;
    }
  } catch (err) {
    for (const h of [full, uid]) {
      console.error(`hostd (${h.stateDir}) log tail:\n${h.logs.slice(-20).join('\n')}`);
    }
    throw err;
  } finally {
    await Promise.all([full.stop(), uid.stop()]);
  }
  results.isolation_load = loadAverage();
  return results;
}
