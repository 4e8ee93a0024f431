/**
 * E2B's code interpreter (docs/e2b.md, Code interpreter) through the unmodified published
 * `@e2b/code-interpreter` package, against a real hostd and real VMs of the `python` template:
 * runCode's results, logs, errors and callbacks, charts and DataFrames, IPython's syntax,
 * contexts, bash, per-execution env vars, an interrupted execution, and a sandbox killed while
 * its code runs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Sandbox, type OutputMessage, type Result } from '@e2b/code-interpreter';
import { NotFoundError, TimeoutError } from 'e2b';
import { withE2b } from '../../testkit/e2b.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { sandboxInfo } from '../../testkit/sandboxes.js';

let hostd: Hostd;
let connection: { apiKey: string; apiUrl: string; sandboxUrl: string; requestTimeoutMs: number };

before(async () => {
  hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' } });
  connection = {
    apiKey: `e2b_${'0'.repeat(40)}`,
    apiUrl: hostd.e2bUrl,
    sandboxUrl: hostd.e2bUrl,
    // A loaded TCG host: a first cell or a figure takes seconds
    requestTimeoutMs: 300_000,
  };
});
after(async () => {
  await hostd.stop();
});

/** A code-interpreter sandbox for `fn`; deleted afterwards, reported when `fn` fails. */
function withSandbox(fn: (sandbox: Sandbox) => Promise<void>): Promise<void> {
  return withE2b(hostd, async (scope) => fn(scope.track(await Sandbox.create(connection))));
}

/**
 * No client-side limit on a cell's run time, nor on its answer's start: the host is slow, not
 * the code. Also, runCode clears its request timer only once an answer starts, so a request
 * refused before that (an unknown context, a killed sandbox) left the connection's 300 s timer
 * running, and it held this file's process ~5 minutes after its last test; with 0 there is none.
 */
const slow = { timeoutMs: 0, requestTimeoutMs: 0 };

describe('runCode', () => {
  test('results, logs, errors and callbacks mean what they mean on E2B', async () => {
    await withSandbox(async (sandbox) => {
      const first = await sandbox.runCode('x = 1; x', slow);
      assert.equal(first.text, '1');
      assert.equal(first.executionCount, 1);
      assert.equal(first.results[0]!.isMainResult, true);
      assert.deepEqual(first.logs, { stdout: [], stderr: [] });
      assert.equal((await sandbox.runCode('x += 1; x', slow)).text, '2', 'state persists');
      assert.equal((await sandbox.runCode('"abc"', slow)).text, 'abc', 'quotes stripped');

      const stdout: OutputMessage[] = [];
      const stderr: OutputMessage[] = [];
      const printed = await sandbox.runCode(
        'import sys\nprint("hello")\nprint("oops", file=sys.stderr)',
        { ...slow, onStdout: (m) => stdout.push(m), onStderr: (m) => stderr.push(m) },
      );
      assert.deepEqual(printed.logs, { stdout: ['hello\n'], stderr: ['oops\n'] });
      assert.deepEqual(
        stdout.map((m) => m.line),
        ['hello\n'],
      );
      assert.equal(stderr.length, 1);

      const errors: unknown[] = [];
      const failed = await sandbox.runCode('def f():\n    return undefined_name\nf()', {
        ...slow,
        onError: (e) => errors.push(e),
      });
      assert.equal(failed.error?.name, 'NameError');
      assert.equal(failed.error?.value, "name 'undefined_name' is not defined");
      assert.match(failed.error!.traceback, /return undefined_name/);
      assert.equal(errors.length, 1);
      assert.equal(failed.executionCount, 5);

      const env = await sandbox.runCode('import os; os.getenv("FOO")', {
        ...slow,
        envs: { FOO: 'bar' },
      });
      assert.equal(env.text, 'bar');
      const envAfter = await sandbox.runCode('os.getenv("FOO", "unset")', slow);
      assert.equal(envAfter.text, 'unset', 'env vars are for one execution');
    });
  });

  test("IPython's syntax: an indented cell, !cmd and %cd, in E2B's working directory", async () => {
    await withSandbox(async (sandbox) => {
      // /home/user is E2B's; templates built before the user account run in /root
      const home = (
        await sandbox.runCode(
          'import os; "/home/user" if os.path.isdir("/home/user") else "/root"',
          slow,
        )
      ).text;
      const cwd = await sandbox.runCode('\n        import os\n        os.getcwd()\n        ', slow);
      assert.equal(cwd.text, home);
      const shell = await sandbox.runCode('!pwd', slow);
      assert.deepEqual(shell.logs.stdout, [`${home}\n`]);
      assert.equal((await sandbox.runCode('!pwd', slow)).executionCount, 4);
      const cd = await sandbox.runCode('%cd /tmp\nos.getcwd()', slow);
      assert.equal(cd.text, '/tmp');
    });
  });

  test('figures, charts and DataFrames come as results with their data', async () => {
    await withSandbox(async (sandbox) => {
      const results: Result[] = [];
      const plotted = await sandbox.runCode(
        `
        import matplotlib.pyplot as plt
        authors = ['Author A', 'Author B', 'Author C']
        sales = [100, 200, 350]
        plt.bar(authors, sales, label='Books Sold')
        plt.xlabel('Authors')
        plt.ylabel('Sold (books)')
        plt.title('Book Sales')
        plt.show()
        sales
        `,
        { ...slow, onResult: (r) => results.push(r) },
      );
      assert.equal(plotted.error, undefined, plotted.error?.traceback);
      assert.equal(results.length, 2, 'the figure, then the value');
      const [figure, value] = plotted.results;
      assert.equal(figure!.isMainResult, false);
      assert.ok(figure!.png && figure!.png.length > 100);
      assert.match(figure!.text!, /^<Figure size/);
      assert.deepEqual(figure!.extra, {});
      const chart = figure!.chart as Record<string, unknown>;
      assert.equal(chart.type, 'bar');
      assert.equal(chart.title, 'Book Sales');
      assert.deepEqual(
        [chart.x_label, chart.y_label, chart.y_unit],
        ['Authors', 'Sold (books)', 'books'],
      );
      assert.deepEqual(chart.elements, [
        { label: 'Author A', group: 'Books Sold', value: 100 },
        { label: 'Author B', group: 'Books Sold', value: 200 },
        { label: 'Author C', group: 'Books Sold', value: 350 },
      ]);
      assert.equal(value!.isMainResult, true);
      assert.deepEqual(value!.json, [100, 200, 350]);

      const frame = await sandbox.runCode(
        'import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None]})',
        slow,
      );
      const table = frame.results[0]!;
      assert.deepEqual(table.data, { a: [1, 2, 3], b: ['x', 'y', null] });
      assert.match(table.html!, /<table/);
      assert.ok(table.formats().includes('data'));
    });
  });
});

describe('contexts and languages', () => {
  test('contexts are independent, listed newest last, restarted and removed', async () => {
    await withSandbox(async (sandbox) => {
      await sandbox.runCode('x = "default"', slow);
      const context = await sandbox.createCodeContext({ cwd: '/tmp' });
      assert.deepEqual([context.language, context.cwd], ['python', '/tmp']);
      const listed = await sandbox.listCodeContexts();
      assert.equal(listed[0]!.language, 'python');
      assert.deepEqual(listed.at(-1), context);
      const isolated = await sandbox.runCode('x', { ...slow, context });
      assert.equal(isolated.error?.value, "name 'x' is not defined");
      await sandbox.runCode('import os\ny = os.getcwd()', { ...slow, context });
      assert.equal((await sandbox.runCode('y', { ...slow, context })).text, '/tmp');
      assert.equal((await sandbox.runCode('x', slow)).text, 'default');
      await sandbox.restartCodeContext(context);
      assert.equal((await sandbox.runCode('y', { ...slow, context })).error?.name, 'NameError');
      await sandbox.removeCodeContext(context.id);
      assert.ok(!(await sandbox.listCodeContexts()).some((c) => c.id === context.id));
      await assert.rejects(sandbox.runCode('1', { ...slow, context }), NotFoundError);
    });
  });

  // Languages hostd has no kernel for, and a context with a language, are refused before any
  // cell runs: test/unit/routes-e2b-interpreter.test.ts
  test("bash runs as bash, in E2B's working directory", async () => {
    await withSandbox(async (sandbox) => {
      // E2B's working directory (templates built before the user account lack it)
      await sandbox.runCode('!mkdir -p /home/user', slow);
      const bash = await sandbox.runCode('echo "$((6 * 7))"; pwd', { ...slow, language: 'bash' });
      assert.deepEqual(bash.logs.stdout, ['42\n', '/home/user\n']);
    });
  });
});

describe('interrupts and kills', () => {
  test('a client that gives up interrupts the code, and the next cell runs', async () => {
    await withSandbox(async (sandbox) => {
      await assert.rejects(sandbox.runCode('import time; time.sleep(300)', { timeoutMs: 3_000 }));
      const next = await sandbox.runCode('1 + 1', slow);
      assert.equal(next.text, '2');
    });
  });

  test('a sandbox killed while its code runs: the SDK says so', async () => {
    await withSandbox(async (sandbox) => {
      const running = sandbox.runCode('import time; time.sleep(300)', {
        timeoutMs: 300_000,
        requestTimeoutMs: 0,
      });
      const outcome = running.then(
        () => assert.fail('runCode returned'),
        (err: unknown) => err,
      );
      await eventually(
        'the cell to run',
        async () => (await sandboxInfo(hostd, sandbox.sandboxId)).busy,
      );
      await sandbox.kill();
      const err = await outcome;
      assert.ok(err instanceof TimeoutError, String(err));
      assert.match((err as Error).message, /sandbox was killed while the request was in progress/);
    });
  });
});
