/**
 * Data work in the `python` template, with real VMs: what its recipe's `warmup` did before the
 * template was frozen is there in every new sandbox (and nothing of it leaks into the user's
 * namespace), and numbers computed in the guest equal the host's, so that the guest CPU model and
 * the BLAS kernels chosen for it (docs/architecture.md, "Compute under TCG") never buy a wrong
 * answer or a SIGILL. The host computes its side in JavaScript: it need not have numpy.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from '../../testkit/exec.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { withSandbox } from '../../testkit/sandboxes.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' }, startTimeoutMs: 900_000 });
});
after(async () => {
  await hostd.stop();
});

/** The last stdout line of an exec, parsed as JSON; the exec must succeed (withSandbox reports it). */
async function jsonOf(id: string, code: string, language = 'python'): Promise<unknown> {
  const r = await run(hostd, id, code, { language });
  assert.equal(r.exit, 0, `exec failed: ${r.stderr.slice(-800)}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

/**
 * What the `python` recipe preloads beyond numpy, pandas and pyplot: the rest of the data stack's
 * first imports, each seconds of emulated CPU under TCG in a sandbox that imports it itself.
 */
const STACK_PRELOADS = [
  'scipy.stats',
  'scipy.optimize',
  'sklearn.linear_model',
  'sklearn.model_selection',
  'sympy',
  'networkx',
  'PIL.Image',
  'requests',
  'bs4',
  'lxml.etree',
  'openpyxl',
  'yaml',
];

test('a new python sandbox starts with the data stack imported and the warmup done: fonts looked up, Agg loaded, no figure or name left', async () => {
  await withSandbox(hostd, async (id) => {
    const state = await jsonOf(
      id,
      `import sys, json
not_loaded = [m for m in ${JSON.stringify(STACK_PRELOADS)} if m not in sys.modules]
from matplotlib import font_manager
import matplotlib.pyplot as plt
print(json.dumps({
  "not_loaded": not_loaded,
  "agg": "matplotlib.backends.backend_agg" in sys.modules,
  "fonts_looked_up": font_manager.FontManager._findfont_cached.cache_info().currsize > 0,
  "open_figures": plt.get_fignums(),
  "warmup_names": sorted(n for n in ("fig", "ax", "df", "io", "np", "pd", "sklearn", "scipy") if n in globals()),
}))`,
    );
    assert.deepEqual(state, {
      not_loaded: [],
      agg: true,
      fonts_looked_up: true,
      open_figures: [],
      warmup_names: [],
    });
  });
});

const N = 300;
/** The matrix both sides multiply: exact in binary floating point, with varied magnitudes. */
const entry = (i: number, j: number): number => ((i * 7 + j * 13) % 101) / 64 - 0.75;

/** Checksums of A @ A that a wrong kernel would change: sum, sum of squares, a weighted sum. */
function hostMatmulChecksums(): {
  sum: number;
  squares: number;
  weighted: number;
  c17_123: number;
} {
  const a = Array.from({ length: N }, (_, i) =>
    Float64Array.from({ length: N }, (_, j) => entry(i, j)),
  );
  let sum = 0;
  let squares = 0;
  let weighted = 0;
  let c17_123 = 0;
  for (let i = 0; i < N; i++) {
    for (let j = 0; j < N; j++) {
      let c = 0;
      for (let k = 0; k < N; k++) c += a[i]![k]! * a[k]![j]!;
      sum += c;
      squares += c * c;
      weighted += c * ((i % 5) - (j % 3));
      if (i === 17 && j === 123) c17_123 = c;
    }
  }
  return { sum, squares, weighted, c17_123 };
}

const GUEST_MATMUL = `import json, numpy as np
i, j = np.indices((${N}, ${N}))
a = ((i * 7 + j * 13) % 101) / 64 - 0.75
c = a @ a
w = (i % 5) - (j % 3)
print(json.dumps({"sum": float(c.sum()), "squares": float((c * c).sum()),
                  "weighted": float((c * w).sum()), "c17_123": float(c[17, 123])}))`;

const close = (guest: number, host: number, what: string): void => {
  const tolerance = 1e-9 * Math.max(1, Math.abs(host));
  assert.ok(Math.abs(guest - host) <= tolerance, `${what}: guest ${guest}, host ${host}`);
};

test('a 300x300 matrix product equals the host`s, in the REPL and in a fresh python3', async (t) => {
  const host = hostMatmulChecksums();
  await withSandbox(hostd, async (id) => {
    const cpu = await run(
      hostd,
      id,
      'echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"; grep -m1 "^flags" /proc/cpuinfo',
      { language: 'bash' },
    );
    t.diagnostic(cpu.stdout.trim());
    const inRepl = (await jsonOf(id, GUEST_MATMUL)) as typeof host;
    // A new interpreter loads OpenBLAS again with the sandbox's environment: a kernel the
    // emulated CPU lacks would die of SIGILL here.
    const fresh = (await jsonOf(
      id,
      `python3 - <<'EOF'\n${GUEST_MATMUL}\nEOF`,
      'bash',
    )) as typeof host;
    for (const guest of [inRepl, fresh]) {
      for (const k of ['sum', 'squares', 'weighted', 'c17_123'] as const)
        close(guest[k], host[k], k);
    }
  });
});

/** pandas' describe() of one column: count, mean, std (n-1), min, linear quartiles, max. */
function hostDescribe(xs: number[]): number[] {
  const n = xs.length;
  const mean = xs.reduce((s, x) => s + x, 0) / n;
  const std = Math.sqrt(xs.reduce((s, x) => s + (x - mean) ** 2, 0) / (n - 1));
  const sorted = [...xs].sort((a, b) => a - b);
  const q = (p: number): number => {
    const pos = (n - 1) * p;
    const lo = Math.floor(pos);
    return sorted[lo]! + (sorted[Math.min(lo + 1, n - 1)]! - sorted[lo]!) * (pos - lo);
  };
  return [n, mean, std, sorted[0]!, q(0.25), q(0.5), q(0.75), sorted[n - 1]!];
}

test('describe() and a groupby equal the host`s', async () => {
  const xs = Array.from({ length: 2000 }, (_, i) => Math.sin(i) * 3 + (i % 7));
  const groups = new Map<number, number[]>();
  xs.forEach((x, i) => groups.set(i % 3, [...(groups.get(i % 3) ?? []), x]));
  await withSandbox(hostd, async (id) => {
    const guest = (await jsonOf(
      id,
      `import json, numpy as np, pandas as pd
i = np.arange(2000)
df = pd.DataFrame({"g": i % 3, "x": np.sin(i) * 3 + (i % 7)})
print(json.dumps({"describe": df["x"].describe().tolist(),
                  "means": df.groupby("g")["x"].mean().tolist()}))`,
    )) as { describe: number[]; means: number[] };
    const host = hostDescribe(xs);
    const names = ['count', 'mean', 'std', 'min', '25%', '50%', '75%', 'max'];
    host.forEach((h, k) => close(guest.describe[k]!, h, names[k]!));
    [0, 1, 2].forEach((g) => {
      const v = groups.get(g)!;
      close(guest.means[g]!, v.reduce((s, x) => s + x, 0) / v.length, `mean of group ${g}`);
    });
  });
});
