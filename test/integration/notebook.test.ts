/**
 * Notebook mode and REPL contexts (docs/api.md, Notebook mode, Contexts) with real VMs and the
 * `python` template's real pandas and matplotlib: a cell's value as a `result`, its exception
 * as an `error`, IPython's syntax, the data behind a DataFrame and the chart behind a figure
 * checked against what the host computes from the same numbers, and contexts as independent
 * namespaces that forks copy.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { execEvents, run, type ExecEvent } from '../../testkit/exec.js';
import { withSandbox, withSandboxes } from '../../testkit/sandboxes.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' } });
});
after(async () => {
  await hostd.stop();
});

type Bundle = Record<string, unknown>;
const DATA = 'application/vnd.hostd.dataframe+json';
const CHART = 'application/vnd.hostd.chart+json';

/** A notebook cell's events, by kind. */
async function cell(
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<{
  events: ExecEvent[];
  count: number | undefined;
  result: Bundle | undefined;
  displays: Bundle[];
  error: { name: string; value: string; traceback: string } | undefined;
  stdout: string[];
  exit: number;
}> {
  const events = await execEvents(hostd, id, code, { notebook: true, ...extra });
  const of = (type: string): ExecEvent[] => events.filter((e) => (e.type as string) === type);
  return {
    events,
    count: of('execution_count')[0]?.data as number | undefined,
    result: of('result')[0]?.data as Bundle | undefined,
    displays: of('display').map((e) => e.data as Bundle),
    error: of('error')[0]?.data as never,
    stdout: of('stdout').map((e) => e.data as string),
    exit: Number(of('exit')[0]?.data),
  };
}

/** numpy's default percentile (linear interpolation between closest ranks). */
function percentile(values: number[], q: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q / 100) * (sorted.length - 1);
  const lo = Math.floor(at);
  const hi = Math.ceil(at);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (at - lo);
}

const close = (a: unknown, b: number, what: string): void =>
  assert.ok(
    typeof a === 'number' && Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)),
    `${what}: ${String(a)} != ${b}`,
  );

describe('notebook cells', () => {
  test('the value is a result, an exception an error event, counts go up', async () => {
    await withSandbox(hostd, async (id) => {
      const first = await cell(id, 'x = 41\nx + 1');
      assert.deepEqual(first.result, { 'text/plain': '42' });
      assert.deepEqual(first.stdout, [], 'nothing printed for the value');
      assert.equal(first.count, 1);
      assert.equal(first.events[0]!.type as string, 'execution_count', 'the count comes first');
      const failed = await cell(id, 'print("before")\nundefined_name');
      assert.equal(failed.exit, 1);
      assert.equal(failed.count, 2);
      assert.deepEqual(failed.stdout, ['before']);
      assert.equal(failed.error?.name, 'NameError');
      assert.equal(failed.error?.value, "name 'undefined_name' is not defined");
      assert.match(failed.error!.traceback, /^Traceback \(most recent call last\):/);
      assert.ok(!failed.events.some((e) => e.type === 'stderr'), 'no traceback on stderr');
      const plain = await run(hostd, id, 'x');
      assert.equal(plain.stdout, '41\n', 'a plain exec in the same namespace still prints');
    });
  });

  test("IPython's syntax: an indented cell, !cmd, x = !cmd, %cd, and a partial line", async () => {
    await withSandbox(hostd, async (id) => {
      const shell = await cell(
        id,
        '\n    !echo hello $HOME\n    files = !ls /\n    "bin" in files\n',
      );
      assert.deepEqual(shell.stdout, ['hello /root']);
      assert.deepEqual(shell.result, { 'text/plain': 'True' });
      const cd = await cell(id, '%cd /tmp\n%pwd');
      assert.deepEqual(cd.stdout, ['/tmp']);
      assert.deepEqual(cd.result, { 'text/plain': "'/tmp'" });
      assert.equal((await run(hostd, id, 'import os\nprint(os.getcwd())')).stdout, '/tmp\n');
      const partial = await cell(id, 'import sys\nsys.stdout.write("no newline")\nNone');
      const out = partial.events.find((e) => e.type === 'stdout') as ExecEvent & {
        partial?: boolean;
      };
      assert.equal(out.data, 'no newline');
      assert.equal(out.partial, true);
    });
  });

  test("a DataFrame's describe() carries the numbers the host computes", async () => {
    await withSandbox(hostd, async (id) => {
      const a = [3.5, -1.25, 7, 2, 10.125, 0.5, 4, 4, 9.75, -3];
      const b = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89];
      const r = await cell(
        id,
        `import pandas as pd\ndf = pd.DataFrame({"a": ${JSON.stringify(a)}, "b": ${JSON.stringify(b)}})\ndf.describe()`,
      );
      assert.equal(r.exit, 0, JSON.stringify(r.events));
      assert.ok(typeof r.result?.['text/html'] === 'string', 'the table is there too');
      const data = r.result?.[DATA] as Record<string, number[]>;
      for (const [name, values] of Object.entries({ a, b })) {
        const n = values.length;
        const mean = values.reduce((s, v) => s + v, 0) / n;
        const std = Math.sqrt(values.reduce((s, v) => s + (v - mean) ** 2, 0) / (n - 1));
        const expected = [
          n,
          mean,
          std,
          Math.min(...values),
          percentile(values, 25),
          percentile(values, 50),
          percentile(values, 75),
          Math.max(...values),
        ];
        assert.equal(data[name]!.length, 8);
        expected.forEach((v, i) => close(data[name]![i], v, `${name}[${i}]`));
      }
      const frame = await cell(id, 'df.head(3)');
      assert.deepEqual(frame.result?.[DATA], { a: a.slice(0, 3), b: b.slice(0, 3) });
    });
  });

  test("a figure's chart: lines, bars, boxes and a pie, as the host computes them", async () => {
    await withSandbox(hostd, async (id) => {
      const xs = [0, 1, 2, 3, 4, 5];
      const ys = xs.map((x) => x * x - 2.5);
      const bars = { alpha: 3.25, beta: 7, gamma: 1.5 };
      const boxes = {
        A: [85, 90, 78, 92, 88],
        B: [95, 89, 76, 91, 84, 87],
        C: [75, 82, 88, 79, 86, 60, 120],
      };
      const pie = [30, 45, 25];
      const code = `
        import matplotlib.pyplot as plt
        fig, axs = plt.subplots(2, 2)
        fig.suptitle("All of them")
        axs[0][0].plot(${JSON.stringify(xs)}, ${JSON.stringify(ys)}, label="parabola")
        axs[0][0].set_xlabel("Time (s)")
        axs[0][0].set_ylabel("Level [dB]")
        axs[0][0].set_title("Line")
        axs[0][1].bar(${JSON.stringify(Object.keys(bars))}, ${JSON.stringify(Object.values(bars))}, label="sales")
        axs[1][0].boxplot(${JSON.stringify(Object.values(boxes))}, labels=${JSON.stringify(Object.keys(boxes))}, patch_artist=True)
        axs[1][1].pie(${JSON.stringify(pie)}, labels=["x", "y", "z"])
        plt.show()
      `;
      const r = await cell(id, code);
      assert.equal(r.exit, 0, JSON.stringify(r.events).slice(0, 2000));
      assert.equal(r.displays.length, 1);
      assert.ok(typeof r.displays[0]!['image/png'] === 'string');
      const chart = r.displays[0]![CHART] as {
        type: string;
        title: string;
        elements: Record<string, unknown>[];
      };
      assert.equal(chart.type, 'superchart');
      assert.equal(chart.title, 'All of them');
      const [line, bar, box, round] = chart.elements as Record<string, unknown>[];

      assert.equal(line!.type, 'line');
      assert.deepEqual([line!.x_label, line!.x_unit, line!.y_unit], ['Time (s)', 's', 'dB']);
      const points = (line!.elements as unknown as { label: string; points: number[][] }[])[0]!;
      assert.equal(points.label, 'parabola');
      assert.deepEqual(
        points.points,
        xs.map((x, i) => [x, ys[i]]),
      );

      assert.equal(bar!.type, 'bar');
      assert.deepEqual(
        (bar!.elements as unknown as { label: string; value: number; group: string }[]).map((e) => [
          e.label,
          e.value,
          e.group,
        ]),
        Object.entries(bars).map(([k, v]) => [k, v, 'sales']),
      );

      assert.equal(box!.type, 'box_and_whisker');
      const stats = box!.elements as unknown as Record<string, number | number[] | string>[];
      assert.deepEqual(
        stats.map((s) => s.label),
        Object.keys(boxes),
      );
      Object.values(boxes).forEach((values, i) => {
        const q1 = percentile(values, 25);
        const q3 = percentile(values, 75);
        const iqr = q3 - q1;
        const inside = values.filter((v) => v >= q1 - 1.5 * iqr && v <= q3 + 1.5 * iqr);
        const s = stats[i]!;
        close(s.first_quartile, q1, `box ${i} q1`);
        close(s.median, percentile(values, 50), `box ${i} median`);
        close(s.third_quartile, q3, `box ${i} q3`);
        close(s.min, Math.min(...inside), `box ${i} min`);
        close(s.max, Math.max(...inside), `box ${i} max`);
        assert.deepEqual(
          [...(s.outliers as number[])].sort((x, y) => x - y),
          values.filter((v) => !inside.includes(v)).sort((x, y) => x - y),
        );
      });

      assert.equal(round!.type, 'pie');
      const total = pie.reduce((s, v) => s + v, 0);
      (round!.elements as unknown as { label: string; angle: number; radius: number }[]).forEach(
        (w, i) => {
          assert.equal(w.label, ['x', 'y', 'z'][i]);
          close(w.angle, (360 * pie[i]!) / total, `wedge ${i}`);
          assert.equal(w.radius, 1);
        },
      );
    });
  });
});

describe('contexts', () => {
  test('independent namespaces and directories, listed, restarted, deleted', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'x = "default"');
      const created = await hostd.json<{ id: string; cwd: string; execution_count: number }>(
        'POST',
        `/v1/sandboxes/${id}/contexts`,
        { id: 'work', cwd: '/tmp' },
      );
      assert.equal(created.status, 200);
      assert.deepEqual(created.body, { id: 'work', cwd: '/tmp', execution_count: 0 });
      const there = await cell(id, 'import os\nx = "work"\nos.getcwd()', { context: 'work' });
      assert.deepEqual(there.result, { 'text/plain': "'/tmp'" });
      assert.equal(there.count, 1);
      assert.equal(
        (await run(hostd, id, 'import os\nprint(x, os.getcwd())')).stdout,
        'default /root\n',
      );
      const listed = await hostd.json<{ contexts: { id: string; cwd: string }[] }>(
        'GET',
        `/v1/sandboxes/${id}/contexts`,
      );
      assert.deepEqual(
        listed.body.contexts.map((c) => [c.id, c.cwd]),
        [
          ['default', '/root'],
          ['work', '/tmp'],
        ],
      );
      const restarted = await hostd.request('POST', `/v1/sandboxes/${id}/contexts/work/restart`);
      assert.equal(restarted.status, 200);
      const gone = await cell(id, 'x', { context: 'work' });
      assert.equal(gone.error?.name, 'NameError');
      assert.equal(
        (await hostd.request('DELETE', `/v1/sandboxes/${id}/contexts/work`)).status,
        204,
      );
      const missing = await hostd.json<{ code: string }>('POST', `/v1/sandboxes/${id}/exec`, {
        code: 'x',
        context: 'work',
      });
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'context_not_found');
      const again = await hostd.json<{ code: string }>(
        'DELETE',
        `/v1/sandboxes/${id}/contexts/default`,
      );
      assert.equal(again.body.code, 'context_is_default');
    });
  });

  test('a fork child has its parent’s contexts and their state', async () => {
    await withSandboxes(hostd, async (scope) => {
      const id = await scope.create();
      await hostd.json('POST', `/v1/sandboxes/${id}/contexts`, { id: 'c1' });
      await run(hostd, id, 'y = 7', { context: 'c1' });
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${id}/fork`,
        { n: 1 },
      );
      const child = scope.track(fork.body.children[0]!.id);
      assert.equal((await run(hostd, child, 'print(y)', { context: 'c1' })).stdout, '7\n');
    });
  });
});
