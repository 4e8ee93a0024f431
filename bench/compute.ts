/**
 * Issue 29's compute figures: a small chart and a 300x300 matrix product in the guest, each
 * beside the same code run natively by the host's `python3` in the same run (skipped, with the
 * reason, when the host has no numpy or matplotlib: install Debian's python3-matplotlib and
 * python3-pandas to get them). docs/architecture.md, "Compute under TCG", says what moves them.
 */
import { spawnSync } from 'node:child_process';
import type { Api } from '../testkit/hostd.js';
import { createSandbox } from '../testkit/sandboxes.js';
import { Skip } from './skip.js';
import { exec, now, pct, stdoutOf, type Results } from './util.js';

/** One figure rendered to a PNG in memory, as an agent's plotting step does. */
const CHART = [
  'import io',
  'import matplotlib.pyplot as plt',
  'fig, ax = plt.subplots()',
  'ax.plot([1, 2, 5])',
  'ax.set_title("t")',
  'fig.savefig(io.BytesIO(), format="png")',
  'plt.close(fig)',
].join('\n');

/**
 * Milliseconds of five 300x300 float64 products after one untimed, as one JSON list on the last
 * line of stdout (no bare expression: a REPL may display its value).
 */
const MATMUL = [
  'import json, time, numpy as np',
  'a = np.random.default_rng(1).random((300, 300))',
  'b = a @ a',
  'ts = []',
  'for _ in range(5):',
  '    t = time.perf_counter()',
  '    b = a @ a',
  '    ts.append((time.perf_counter() - t) * 1000)',
  'print(json.dumps(ts))',
].join('\n');

/** Every figure computeFigures reports (all skipped together when the template cannot plot). */
export const COMPUTE_FIGURES = [
  'chart_first_in_new_sandbox_ms',
  'chart_warm_ms',
  'matmul_300_ms',
  'chart_first_native_ms',
  'chart_warm_native_ms',
  'matmul_300_native_ms',
  'chart_first_ratio',
  'chart_warm_ratio',
  'matmul_300_ratio',
];

const SANDBOXES = 3;
const WARM_CHARTS = 3;

export async function computeFigures(c: Api): Promise<Results> {
  const first: number[] = [];
  const warm: number[] = [];
  let matmul: number[] = [];
  for (let i = 0; i < SANDBOXES; i++) {
    const id = await createSandbox(c);
    try {
      let t = now();
      await exec(c, id, CHART).catch((err: Error) => {
        if (err.message.includes('ModuleNotFoundError')) {
          throw new Skip('no matplotlib in the template');
        }
        throw err;
      });
      first.push(now() - t);
      if (i > 0) continue;
      for (let k = 0; k < WARM_CHARTS; k++) {
        t = now();
        await exec(c, id, CHART);
        warm.push(now() - t);
      }
      matmul = lastList(stdoutOf(await exec(c, id, MATMUL)));
    } finally {
      await c.request('DELETE', `/v1/sandboxes/${id}`);
    }
  }
  const native = nativeFigures();
  const ratio = (vm: number, nat: number | string): number | string =>
    typeof nat === 'number' ? Math.round((vm / nat) * 10) / 10 : nat;
  const chartFirst = pct(first, 50);
  const chartWarm = pct(warm, 50);
  const matmul300 = pct(matmul, 50);
  return {
    chart_first_in_new_sandbox_ms: Math.round(chartFirst),
    chart_warm_ms: Math.round(chartWarm),
    matmul_300_ms: matmul300,
    chart_first_native_ms: native.chartFirst,
    chart_warm_native_ms: native.chartWarm,
    matmul_300_native_ms: native.matmul,
    chart_first_ratio: ratio(chartFirst, native.chartFirst),
    chart_warm_ratio: ratio(chartWarm, native.chartWarm),
    matmul_300_ratio: ratio(matmul300, native.matmul),
  };
}

/** The JSON list on the last line of `out` that holds one. */
const lastList = (out: string): number[] => {
  const line = out
    .trim()
    .split('\n')
    .reverse()
    .find((l) => l.startsWith('['));
  return line ? (JSON.parse(line) as number[]) : [];
};

/**
 * The same code in the host's python3: the first chart of a fresh interpreter that has
 * imported pyplot already (a sandbox has it preloaded), the next ones, and the products.
 */
function nativeFigures(): {
  chartFirst: number | string;
  chartWarm: number | string;
  matmul: number | string;
} {
  const script = [
    'import json, time, matplotlib',
    'matplotlib.use("Agg")',
    'import matplotlib.pyplot as plt',
    'def chart():',
    '    t = time.perf_counter()',
    ...CHART.split('\n').map((l) => `    ${l}`),
    '    return (time.perf_counter() - t) * 1000',
    `print(json.dumps([chart() for _ in range(${1 + WARM_CHARTS})]))`,
    MATMUL,
  ].join('\n');
  const r = spawnSync('python3', ['-c', script], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) {
    const why = /ModuleNotFoundError: No module named '([^']+)'/.exec(r.stderr)?.[1];
    const reason = why
      ? `skipped: no ${why} in the host python3 (Debian: python3-matplotlib)`
      : `skipped: host python3 failed (${(r.error?.message ?? r.stderr.trim().split('\n').pop() ?? '').slice(0, 120)})`;
    return { chartFirst: reason, chartWarm: reason, matmul: reason };
  }
  const [charts, products] = r.stdout
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('['))
    .map((l) => JSON.parse(l) as number[]);
  const round = (n: number): number => Math.round(n * 100) / 100;
  return {
    chartFirst: round(charts![0]!),
    chartWarm: round(pct(charts!.slice(1), 50)),
    matmul: round(pct(products!, 50)),
  };
}
