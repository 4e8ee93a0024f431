/**
 * Issue 29's compute figures: a small chart, a 300x300 matrix product and the first use of
 * scikit-learn in the guest, each beside the same code run natively by the host's `python3` in
 * the same run (skipped, with the reason, when the host lacks a module: install Debian's
 * python3-matplotlib, python3-pandas and python3-sklearn to get them). docs/architecture.md,
 * "Compute under TCG", says what moves them.
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

/**
 * An agent's first scikit-learn cell: `import sklearn` and a tiny fit, in a new sandbox. Most of
 * it is importing scipy and sklearn (hundreds of modules), which TCG translates anew in every VM
 * unless the template has imported them before it was frozen.
 */
const SKLEARN = [
  'import numpy as np',
  'import sklearn',
  'from sklearn.linear_model import LinearRegression',
  'LinearRegression().fit(np.arange(10.0).reshape(-1, 1), np.arange(10.0))',
].join('\n');

/** Every figure computeFigures reports (all skipped together when the template cannot plot). */
export const COMPUTE_FIGURES = [
  'chart_first_in_new_sandbox_ms',
  'chart_warm_ms',
  'matmul_300_ms',
  'import_sklearn_first_ms',
  'chart_first_native_ms',
  'chart_warm_native_ms',
  'matmul_300_native_ms',
  'import_sklearn_first_native_ms',
  'chart_first_ratio',
  'chart_warm_ratio',
  'matmul_300_ratio',
  'import_sklearn_first_ratio',
];

const SANDBOXES = 3;
const WARM_CHARTS = 3;
const SKLEARN_SANDBOXES = 2;

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
  const sklearn = await sklearnFirst(c);
  const native = nativeFigures();
  const sklearnNative = nativeSklearn();
  const ratio = (vm: number, nat: number | string): number | string =>
    typeof nat === 'number' ? Math.round((vm / nat) * 10) / 10 : nat;
  const chartFirst = pct(first, 50);
  const chartWarm = pct(warm, 50);
  const matmul300 = pct(matmul, 50);
  const sklearn50 = typeof sklearn === 'string' ? sklearn : pct(sklearn, 50);
  return {
    chart_first_in_new_sandbox_ms: Math.round(chartFirst),
    chart_warm_ms: Math.round(chartWarm),
    matmul_300_ms: matmul300,
    import_sklearn_first_ms: typeof sklearn50 === 'string' ? sklearn50 : Math.round(sklearn50),
    chart_first_native_ms: native.chartFirst,
    chart_warm_native_ms: native.chartWarm,
    matmul_300_native_ms: native.matmul,
    import_sklearn_first_native_ms: sklearnNative,
    chart_first_ratio: ratio(chartFirst, native.chartFirst),
    chart_warm_ratio: ratio(chartWarm, native.chartWarm),
    matmul_300_ratio: ratio(matmul300, native.matmul),
    import_sklearn_first_ratio:
      typeof sklearn50 === 'string' ? sklearn50 : ratio(sklearn50, sklearnNative),
  };
}

/**
 * Milliseconds of SKLEARN as the first cell of each of a few new sandboxes, or why not (a
 * template without scikit-learn).
 */
async function sklearnFirst(c: Api): Promise<number[] | string> {
  const times: number[] = [];
  for (let i = 0; i < SKLEARN_SANDBOXES; i++) {
    const id = await createSandbox(c);
    try {
      const t = now();
      const missing = await exec(c, id, SKLEARN).then(
        () => null,
        (err: Error) => {
          if (err.message.includes('ModuleNotFoundError'))
            return 'skipped: no scikit-learn in the template';
          throw err;
        },
      );
      if (missing) return missing;
      times.push(now() - t);
    } finally {
      await c.request('DELETE', `/v1/sandboxes/${id}`);
    }
  }
  return times;
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
  const lists = runNative(script, 'python3-matplotlib');
  if (typeof lists === 'string') return { chartFirst: lists, chartWarm: lists, matmul: lists };
  const [charts, products] = lists;
  return {
    chartFirst: round2(charts![0]!),
    chartWarm: round2(pct(charts!.slice(1), 50)),
    matmul: round2(pct(products!, 50)),
  };
}

/**
 * SKLEARN in a fresh host python3 that has imported what a sandbox starts with (numpy, and
 * pandas and pyplot when the host has them: not timed), as the guest figure's counterpart.
 */
function nativeSklearn(): number | string {
  const script = [
    'import json, time, numpy',
    'try:',
    '    import pandas, matplotlib',
    '    matplotlib.use("Agg")',
    '    import matplotlib.pyplot',
    'except ImportError:',
    '    pass',
    't = time.perf_counter()',
    SKLEARN,
    'print(json.dumps([(time.perf_counter() - t) * 1000]))',
  ].join('\n');
  const lists = runNative(script, 'python3-sklearn');
  return typeof lists === 'string' ? lists : round2(lists[0]![0]!);
}

const round2 = (n: number): number => Math.round(n * 100) / 100;

/**
 * The JSON lists `script` prints in the host's python3, or why it could not run (`debian`: the
 * package that provides what the script needs).
 */
function runNative(script: string, debian: string): number[][] | string {
  const r = spawnSync('python3', ['-c', script], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) {
    const why = /ModuleNotFoundError: No module named '([^']+)'/.exec(r.stderr)?.[1];
    return why
      ? `skipped: no ${why} in the host python3 (Debian: ${debian})`
      : `skipped: host python3 failed (${(r.error?.message ?? r.stderr.trim().split('\n').pop() ?? '').slice(0, 120)})`;
  }
  return r.stdout
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('['))
    .map((l) => JSON.parse(l) as number[]);
}
