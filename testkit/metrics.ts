/**
 * Reading hostd's /metrics (Prometheus text) and waiting on what it says: a pool refilled, the
 * QEMUs hostd starts ahead for forks all started, no exec running.
 */
import { eventually } from './eventually.js';
import type { Api } from './hostd.js';

/**
 * The value of sample `name` with exactly `labels` in a /metrics text, or null when absent.
 * @example sample(text, 'hostd_pool_ready', { template: 'python' }) // 2
 */
export function sample(
  text: string,
  name: string,
  labels: Record<string, string> = {},
): number | null {
  const want = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort()
    .join(',');
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = (m[2] ?? '').split(',').filter(Boolean).sort().join(',');
    if (have === want) return Number(m[3]);
  }
  return null;
}

export async function metricsText(api: Api): Promise<string> {
  const res = await api.request('GET', '/metrics');
  if (res.status !== 200) throw new Error(`/metrics returned ${res.status}`);
  return res.text();
}

/** The current value of one metric sample (null when hostd does not report it). */
export async function metric(
  api: Api,
  name: string,
  labels: Record<string, string> = {},
): Promise<number | null> {
  return sample(await metricsText(api), name, labels);
}

/** Resolves once `template`'s warm pool holds at least `atLeast` ready VMs. */
export async function poolHolds(api: Api, template: string, atLeast: number): Promise<void> {
  await eventually(
    `the ${template} pool to hold ${atLeast} ready VMs`,
    async () => ((await metric(api, 'hostd_pool_ready', { template })) ?? 0) >= atLeast,
    { timeoutMs: 120_000, everyMs: 25 },
  );
}

/**
 * Waits until hostd has finished starting the QEMUs it keeps ready for forks (after each fork
 * it starts as many as that fork had children, up to 32, one at a time, in the background: as
 * long as a pool refill, on a loaded host) and returns how many wait.
 */
export async function forkStandbySettled(api: Api): Promise<number> {
  const text = await eventually(
    'the fork standby to settle',
    async () => {
      const t = await metricsText(api);
      return sample(t, 'hostd_fork_standby_filling') === 0 ? t : null;
    },
    { timeoutMs: 120_000, everyMs: 50 },
  );
  return sample(text, 'hostd_fork_standby_vms') ?? NaN;
}

/** Resolves once no exec runs anywhere on this hostd. */
export async function noExecRunning(api: Api): Promise<void> {
  await eventually(
    'no exec to be running',
    async () => (await metric(api, 'hostd_execs_running')) === 0,
    { timeoutMs: 60_000, everyMs: 25 },
  );
}
