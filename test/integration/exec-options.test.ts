/**
 * The exec's extras (docs/api.md, Exec and Rich outputs), with real VMs: a sandbox's default
 * environment and an exec's own env and cwd, rich outputs as display events, top-level await,
 * and input() in a sandbox that has no stdin.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox, withSandbox } from '../../testkit/sandboxes.js';

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({ env: { SERVICE_POOL_SIZE: '1' } });
});
after(async () => {
  await hostd.stop();
});

describe('environment and working directory', () => {
  test('the create env is in os.environ and in bash, and fork children inherit it', async () => {
    const id = await createSandbox(hostd, { env: { GREETING: 'hello', TOKEN: 's3cret' } });
    try {
      const py = await run(
        hostd,
        id,
        'import os\nprint(os.environ["GREETING"], os.environ["TOKEN"])',
      );
      assert.equal(py.stdout, 'hello s3cret\n');
      const sh = await run(hostd, id, 'echo "$GREETING"', { language: 'bash' });
      assert.equal(sh.stdout, 'hello\n');
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${id}/fork`,
        {
          n: 1,
        },
      );
      const child = fork.body.children[0]!.id;
      try {
        assert.equal(
          (await run(hostd, child, 'echo "$TOKEN"', { language: 'bash' })).stdout,
          's3cret\n',
        );
      } finally {
        await hostd.request('DELETE', `/v1/sandboxes/${child}`);
      }
    } finally {
      await hostd.request('DELETE', `/v1/sandboxes/${id}`);
    }
  });

  test('an exec env and cwd apply to that Python cell only; bash gets them too', async () => {
    await withSandbox(hostd, async (id) => {
      const cell = await run(hostd, id, 'import os\nprint(os.environ.get("ONLY"), os.getcwd())', {
        env: { ONLY: 'this-cell' },
        cwd: '/tmp',
      });
      assert.equal(cell.stdout, 'this-cell /tmp\n');
      const after = await run(hostd, id, 'print(os.environ.get("ONLY"), os.getcwd())');
      assert.equal(after.stdout, 'None /root\n');
      const sh = await run(hostd, id, 'echo "$ONLY $(pwd)"', {
        language: 'bash',
        env: { ONLY: 'bash' },
        cwd: '/tmp',
      });
      assert.equal(sh.stdout, 'bash /tmp\n');
    });
  });

  test('a cwd that does not exist ends the exec with exit 1 and runs nothing', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, 'ran = True', { cwd: '/no/such/dir' });
      assert.equal(r.exit, 1);
      assert.ok(r.stderr.includes('/no/such/dir'), 'the stderr line names the directory');
      assert.equal((await run(hostd, id, 'print("ran" in globals())')).stdout, 'False\n');
    });
  });
});

describe('rich outputs', () => {
  const RICH = `class Table:
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
    def __repr__(self):
        return "Table(1)"
`;

  test('with display, an object with _repr_html_ is a display event with html and text', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, `${RICH}Table()`, { display: true });
      assert.equal(r.exit, 0);
      const displays = r.events.filter((e) => e.type === 'display');
      assert.equal(displays.length, 1);
      assert.deepEqual(displays[0]!.data, {
        'text/html': '<table><tr><td>1</td></tr></table>',
        'text/plain': 'Table(1)',
      });
      assert.equal(r.stdout, '');
    });
  });

  test('without display the stream is the contract: the repr on stdout, no display events', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, `${RICH}Table()`);
      assert.equal(r.stdout, 'Table(1)\n');
      assert.deepEqual([...new Set(r.events.map((e) => e.type))].sort(), ['exit', 'stdout']);
    });
  });
});

describe('Python cells', () => {
  test('top-level await works, and tasks live on between cells', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(
        hostd,
        id,
        'import asyncio\nticks = []\nasync def tick():\n    while True:\n        ticks.append(1)\n        await asyncio.sleep(0.01)\ntask = asyncio.create_task(tick())\nawait asyncio.sleep(0.05)\nprint(len(ticks) > 0)',
      );
      assert.equal(r.stdout, 'True\n', r.stderr);
      assert.equal((await run(hostd, id, 'print(task.done())')).stdout, 'False\n');
    });
  });

  test('input() prints its prompt, then raises EOFError: a sandbox has no stdin', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, 'input("your name? ")');
      assert.equal(r.exit, 1);
      assert.equal(r.stdout, 'your name? \n');
      assert.ok(r.stderr.includes('EOFError'), r.stderr);
    });
  });

  test("the last expression's echo starts on a line of its own", async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, "import sys\nsys.stdout.write('no-newline')\n10");
      assert.deepEqual(
        r.events.filter((e) => e.type === 'stdout').map((e) => e.data),
        ['no-newline', '10'],
      );
    });
  });
});
