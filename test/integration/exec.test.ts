/**
 * Exec semantics: the persistent Python REPL, bash, the event stream, ordering, timeouts,
 * disconnects and failures after the stream started. Real hostd, real VMs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { sandboxQemuPid, startHostd, type Hostd, type ErrorBody } from '../../testkit/hostd.js';
import { eventually } from '../../testkit/eventually.js';
import { execEvents, holdSandbox, openExec, run, type ExecEvent } from '../../testkit/exec.js';
import { sandboxInfo, untilSandbox, withSandbox } from '../../testkit/sandboxes.js';

/** hostd's own notices in a stream are stderr lines with this prefix (docs/api.md, Exec). */
const isNotice = (e: ExecEvent | undefined): boolean =>
  e?.type === 'stderr' && String(e.data).startsWith('hostd: ');

let hostd: Hostd;
before(async () => {
  hostd = await startHostd();
});
after(async () => {
  await hostd.stop();
});

describe('Python runs in a REPL that lives as long as the sandbox', () => {
  test('variables, imports and open file handles persist across calls', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'import json\nx = 20\nf = open("/tmp/notes.txt", "w")\nf.write("a")');
      const r = await run(hostd, id, 'f.write("b"); f.flush()\nprint(json.dumps({"x": x * 2}))');
      assert.equal(r.stdout, '{"x": 40}\n');
      assert.equal(r.exit, 0);
      assert.equal((await run(hostd, id, 'print(open("/tmp/notes.txt").read())')).stdout, 'ab\n');
    });
  });

  test('the value of a final expression is printed as its repr, None is not', async () => {
    await withSandbox(hostd, async (id) => {
      assert.equal((await run(hostd, id, 'a = [1, "two"]\na')).stdout, "[1, 'two']\n");
      assert.equal((await run(hostd, id, 'None')).stdout, '');
      assert.equal((await run(hostd, id, 'print("p")')).stdout, 'p\n');
    });
  });

  test('an uncaught exception prints a traceback on stderr, exits 1, and state survives', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'kept = "yes"');
      const r = await run(hostd, id, 'def f():\n    raise ValueError("boom")\nf()');
      assert.equal(r.exit, 1);
      assert.match(r.stderr, /Traceback \(most recent call last\)/);
      assert.match(r.stderr, /ValueError: boom/);
      assert.doesNotMatch(r.stderr, /repl_worker|agent\.py/, 'no frames of the worker itself');
      assert.equal((await run(hostd, id, 'print(kept)')).stdout, 'yes\n');
    });
  });

  test('sys.exit(n) exits n and keeps the REPL', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'y = 5');
      assert.equal((await run(hostd, id, 'import sys; sys.exit(7)')).exit, 7);
      assert.equal((await run(hostd, id, 'print(y)')).stdout, '5\n');
    });
  });

  test('if the REPL dies, the next exec gets a fresh one and says so on stderr', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'z = 1');
      assert.equal((await run(hostd, id, 'import os; os._exit(3)')).exit, 3);
      const r = await run(hostd, id, 'print("z" in globals())');
      assert.ok(isNotice(r.events[0]), 'a notice comes first: the state was lost');
      assert.equal(r.stdout, 'False\n');
      assert.equal(r.exit, 0);
    });
  });
});

describe('bash runs in a fresh process per call', () => {
  test('shell state does not persist, the filesystem does', async () => {
    await withSandbox(hostd, async (id) => {
      const bash = { language: 'bash' };
      await run(hostd, id, 'export FOO=1; cd /tmp; echo data > /root/file.txt', bash);
      const r = await run(hostd, id, 'echo "[$FOO] $(pwd) $(cat /root/file.txt)"', bash);
      assert.equal(r.stdout, '[] /root data\n');
      assert.equal((await run(hostd, id, 'exit 3', bash)).exit, 3);
      assert.equal(
        (await run(hostd, id, 'print(open("/root/file.txt").read().strip())')).stdout,
        'data\n',
      );
    });
  });
});

describe('the event stream', () => {
  test('events carry type, data, seq from 0 and a ms timestamp, and end with exit', async () => {
    await withSandbox(hostd, async (id) => {
      const sent = Date.now();
      const events = await execEvents(
        hostd,
        id,
        'import sys\nprint("a")\nprint("b", file=sys.stderr)\nprint("c")',
      );
      assert.deepEqual(
        events.map((e) => [e.type, e.data, e.seq]),
        [
          ['stdout', 'a', 0],
          ['stderr', 'b', 1],
          ['stdout', 'c', 2],
          ['exit', 0, 3],
        ],
      );
      // Host wall-clock ms, stamped while the exec ran, never decreasing.
      const answered = Date.now();
      let last = sent;
      for (const e of events) {
        assert.ok(Number.isInteger(e.ts), `ts ${e.ts}`);
        assert.ok(e.ts >= last && e.ts <= answered, `ts ${e.ts} outside ${sent}..${answered}`);
        last = e.ts;
      }
    });
  });

  test('one event per line; a last line without newline still arrives', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, 'printf "one\\ntwo\\n\\nthree"', { language: 'bash' });
      assert.deepEqual(
        r.events.filter((e) => e.type === 'stdout').map((e) => e.data),
        ['one', 'two', '', 'three'],
      );
    });
  });

  test('invalid UTF-8 is decoded with replacement characters', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(
        hostd,
        id,
        'import sys\n_ = sys.stdout.buffer.write(b"ok \\xff\\xfe end\\n")',
      );
      assert.equal(r.stdout, 'ok \ufffd\ufffd end\n');
    });
  });

  test('a very long line is split into chunks, none dropped', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, 'print("x" * 200000 + "END")');
      const chunks = r.events.filter((e) => e.type === 'stdout').map((e) => String(e.data));
      assert.ok(chunks.length >= 4, `split into ${chunks.length} events`);
      assert.equal(chunks.join(''), 'x'.repeat(200000) + 'END');
    });
  });

  test('events are sent as produced, while the exec still runs', async () => {
    await withSandbox(hostd, async (id) => {
      // The cell prints three lines, then runs until its client goes away: if events were
      // sent only at the end, none would ever arrive.
      const stream = await openExec(hostd, id, {
        code: 'import time\nfor i in range(3):\n    print(i, flush=True)\nwhile True: time.sleep(60)',
      });
      try {
        const lines = [await stream.next(), await stream.next(), await stream.next()];
        assert.deepEqual(
          lines.map((e) => [e?.type, e?.data]),
          [
            ['stdout', '0'],
            ['stdout', '1'],
            ['stdout', '2'],
          ],
        );
        assert.equal((await sandboxInfo(hostd, id)).busy, true, 'the exec still runs');
      } finally {
        stream.abort();
      }
    });
  });

  test('a running exec that prints nothing yet still gets its status and headers', async () => {
    await withSandbox(hostd, async (id) => {
      // openExec resolves when the status line and headers arrive; the cell never ends by itself.
      const stream = await openExec(hostd, id, { code: 'import time\nwhile True: time.sleep(60)' });
      try {
        assert.equal(stream.response.status, 200);
        assert.equal(stream.response.headers.get('content-type'), 'application/x-ndjson');
        assert.equal((await sandboxInfo(hostd, id)).busy, true, 'the exec still runs');
      } finally {
        stream.abort();
      }
    });
  });
});

describe('ordering, timeouts and disconnects', () => {
  test('execs on one sandbox run one at a time in arrival order', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'log = []');
      const first = await holdSandbox(hostd, id, {
        before: 'log.append("first-start")',
        after: 'log.append("first-end")',
      });
      const second = run(hostd, id, 'log.append("second")');
      await untilSandbox(hostd, id, 'the second exec to queue', (s) => s.queued === 1);
      const third = run(hostd, id, 'log.append("third")');
      await untilSandbox(hostd, id, 'the third exec to queue', (s) => s.queued === 2);
      first.release();
      assert.equal((await second).exit, 0);
      assert.equal((await third).exit, 0);
      assert.equal(
        (await run(hostd, id, 'print(log)')).stdout,
        "['first-start', 'first-end', 'second', 'third']\n",
      );
    });
  });

  test('a Python timeout raises KeyboardInterrupt, says so, exits 124 and keeps state', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'kept = 99');
      const r = await run(
        hostd,
        id,
        'try:\n    while True:\n        pass\nexcept KeyboardInterrupt:\n    print("interrupted")\n    raise',
        // Runs from when hostd sends the exec: a cancel that reaches the guest before the cell
        // has started ends it unrun, and a loaded host can take a second to start one.
        { timeout: 5 },
      );
      assert.equal(r.exit, 124);
      assert.equal(r.stdout, 'interrupted\n');
      assert.ok(isNotice(r.events.at(-2)), 'a notice before the exit says why');
      assert.equal((await run(hostd, id, 'print(kept)')).stdout, '99\n');
    });
  });

  test('a bash timeout kills the whole process group', async () => {
    await withSandbox(hostd, async (id) => {
      const r = await run(hostd, id, '(sleep 300; echo late > /tmp/late) & sleep 300', {
        language: 'bash',
        timeout: 1,
      });
      assert.equal(r.exit, 124);
      // Count processes named exactly "sleep" (a -f match would find this shell's own line).
      // They were sent SIGKILL: wait for them to be gone, far sooner than their 300 s.
      await eventually(
        'no sleep left in the guest',
        async () =>
          (await run(hostd, id, 'pgrep -x sleep | wc -l', { language: 'bash' })).stdout === '0\n',
        { timeoutMs: 60_000, everyMs: 200 },
      );
    });
  });

  test('a client that disconnects mid-stream interrupts its exec, so the queue moves on', async () => {
    await withSandbox(hostd, async (id) => {
      const stream = await openExec(hostd, id, {
        code: 'import time\ntry:\n    print("go", flush=True)\n    while True:\n        time.sleep(60)\nfinally:\n    interrupted = True',
      });
      await stream.until('the cell to start', (e) => e.data === 'go');
      stream.abort();
      await untilSandbox(hostd, id, 'the abandoned exec to end', (s) => !s.busy);
      assert.equal((await run(hostd, id, 'print(interrupted)')).stdout, 'True\n');
    });
  });
});

describe('failures after the stream started', () => {
  test('a VM that dies mid-exec ends the stream with stderr + exit -1 and an error; then 500; DELETE works', async () => {
    await withSandbox(hostd, async (id) => {
      const stream = await openExec(hostd, id, {
        code: 'import time\nprint("running", flush=True)\nwhile True: time.sleep(60)',
      });
      await stream.until('the cell to start', (e) => e.data === 'running');
      // Kill this sandbox's QEMU from outside, as an OOM killer or a crash would.
      process.kill(await sandboxQemuPid(hostd, id), 'SIGKILL');
      const events = await stream.rest();
      const last = events.at(-1)!;
      assert.equal(last.type, 'exit');
      assert.equal(last.data, -1);
      assert.equal(typeof last.error, 'string');
      const notice = events.at(-2);
      assert.ok(
        isNotice(notice) && String(notice!.data).endsWith(last.error!),
        'a notice with the reason',
      );
      // The stream ends when the guest's connection drops; the sandbox fails once hostd has
      // seen QEMU exit, a moment later (the jail's keeper exits after QEMU).
      await untilSandbox(hostd, id, 'the sandbox to fail', (s) => s.state === 'failed');

      const again = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, {
        code: '1',
      });
      assert.equal(again.status, 500);
      assert.equal(again.body.code, 'executor_error');
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    });
  });
});
