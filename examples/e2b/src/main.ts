/**
 * Agent code written for E2B, run against hostd unchanged: this program uses nothing but E2B's
 * published SDKs (`@e2b/code-interpreter` over `e2b`) and the three variables they read,
 * E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (README.md beside it). It makes a
 * code-interpreter sandbox, plots a pandas DataFrame, writes a file and reads it back, runs a
 * command, forks the sandbox, and kills both. Any answer that is not what E2B's documentation
 * promises ends it with exit code 1; every sandbox it made is killed either way.
 */
import { Sandbox } from '@e2b/code-interpreter';

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    console.error(`${name} is not set: see README.md`);
    process.exit(2);
  }
}

/** Throws with what was expected and what came, so the run ends with exit code 1. */
function check(what: string, ok: boolean, got?: unknown): void {
  if (!ok) throw new Error(`${what}: got ${JSON.stringify(got)?.slice(0, 500)}`);
  console.log(`ok  ${what}`);
}

// Generous limits: a host without KVM emulates the VMs, and a first chart takes seconds there.
const request = { requestTimeoutMs: 300_000 };
const cell = { ...request, timeoutMs: 300_000 };

const made: Sandbox[] = [];
try {
  const sandbox = await Sandbox.create({ ...request, timeoutMs: 600_000 });
  made.push(sandbox);
  console.log(`sandbox ${sandbox.sandboxId}`);

  // A DataFrame and a chart of it: the figure comes as a PNG with the chart's data, the
  // DataFrame (the cell's value) as HTML with its columns.
  const plotted = await sandbox.runCode(
    [
      'import pandas as pd',
      'import matplotlib.pyplot as plt',
      'rain = pd.DataFrame({"city": ["Oslo", "Lima", "Pune"], "mm": [760, 16, 722]})',
      'plt.bar(rain["city"], rain["mm"])',
      'plt.title("Yearly rain")',
      'plt.show()',
      'rain',
    ].join('\n'),
    cell,
  );
  check('the cell ran without an error', plotted.error === undefined, plotted.error);
  const [figure, table] = plotted.results;
  check('the figure is a PNG', typeof figure?.png === 'string' && figure.png.length > 100);
  const chart = figure?.chart as
    { type?: string; title?: string; elements?: { label: string; value: number }[] } | undefined;
  check(
    'the figure is a bar chart with its bars',
    chart?.type === 'bar' &&
      chart.title === 'Yearly rain' &&
      JSON.stringify(chart.elements?.map((e) => [e.label, e.value])) ===
        JSON.stringify([
          ['Oslo', 760],
          ['Lima', 16],
          ['Pune', 722],
        ]),
    chart,
  );
  check(
    "the DataFrame is the cell's value, with its columns",
    table?.isMainResult === true &&
      JSON.stringify(table.data) ===
        JSON.stringify({ city: ['Oslo', 'Lima', 'Pune'], mm: [760, 16, 722] }) &&
      (table.html ?? '').includes('<table'),
    table?.data,
  );

  // Files in and out, and a command that reads what was written.
  const path = '/home/user/notes/hello.txt';
  await sandbox.files.write(path, 'hello from e2b\n');
  const back = await sandbox.files.read(path);
  check('the file reads back as written', back === 'hello from e2b\n', back);
  const upper = await sandbox.commands.run(`tr a-z A-Z < ${path}`);
  check(
    'the command ran as `user` and printed the file in capitals',
    upper.exitCode === 0 && upper.stdout === 'HELLO FROM E2B\n',
    upper,
  );

  // Fork: a child starts from the parent's running state (its variables and files) and goes
  // its own way; the parent is not touched.
  await sandbox.runCode('answer = 41', cell);
  const [child] = await sandbox.fork({ ...request, count: 1, timeoutMs: 300_000 });
  if (child instanceof Sandbox) made.push(child);
  check('the fork made a sandbox', child instanceof Sandbox, String(child));
  const fork = child as Sandbox;
  const inChild = await fork.runCode('answer += 1\nanswer', cell);
  check("the child has the parent's variables", inChild.text === '42', inChild.text);
  check("the child has the parent's files", (await fork.files.read(path)) === 'hello from e2b\n');
  const inParent = await sandbox.runCode('answer', cell);
  check("the parent's state is its own", inParent.text === '41', inParent.text);

  // Kill: both are gone.
  for (const s of [fork, sandbox]) {
    check(`kill ${s.sandboxId}`, (await s.kill()) === true);
    check(`${s.sandboxId} runs no more`, (await s.isRunning()) === false);
  }
  console.log('all checks passed');
} catch (err) {
  console.error(`FAILED: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
} finally {
  // Whatever failed, no sandbox is left behind (killing a killed one answers false).
  await Promise.all(made.map((s) => s.kill().catch(() => false)));
}
