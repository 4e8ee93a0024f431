/**
 * Exec semantics: the persistent Python REPL, bash, the event stream, ordering, timeouts,
 * disconnects and failures after the stream started. Real hostd, real VMs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { sandboxQemuPid, startHostd, type Hostd, type ErrorBody } from '../../testkit/hostd.js';
import { execEvents, readRemainingEvents, run } from '../../testkit/exec.js';
import { createSandbox, withSandbox } from '../../testkit/sandboxes.js';

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
      assert.match(r.stderr, /hostd: the Python REPL exited \(code 3\); started a fresh one/);
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
      const before = Date.now();
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
      for (const e of events) {
        assert.ok(Number.isInteger(e.ts) && e.ts >= before - 5000 && e.ts <= Date.now() + 5000);
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

  test('events are flushed as produced, not at the end', async () => {
    await withSandbox(hostd, async (id) => {
      const res = await hostd.request('POST', `/v1/sandboxes/${id}/exec`, {
        code: 'import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)',
      });
      const reader = res.body!.getReader();
      const arrivals: number[] = [];
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += new TextDecoder().decode(value);
        const lines = buf.split('\n');
        buf = lines.pop()!;
        for (const l of lines) if (JSON.parse(l).type === 'stdout') arrivals.push(Date.now());
      }
      assert.equal(arrivals.length, 3);
      assert.ok(
        arrivals[2]! - arrivals[0]! >= 600,
        `lines arrived over ${arrivals[2]! - arrivals[0]!} ms`,
      );
    });
  });

  test('a running exec that prints nothing yet still gets its status and headers early', async () => {
    await withSandbox(hostd, async (id) => {
      const started = Date.now();
      // fetch resolves when the status line and headers arrive
      const res = await hostd.request('POST', `/v1/sandboxes/${id}/exec`, {
        code: 'import time\ntime.sleep(3)',
      });
      const waited = Date.now() - started;
      assert.equal(res.status, 200);
      assert.ok(waited < 2000, `headers came after ${waited} ms`);
      await res.text();
    });
  });
});

describe('ordering, timeouts and disconnects', () => {
  test('execs on one sandbox run one at a time in arrival order', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'log = []');
      const slow = run(
        hostd,
        id,
        'import time\nlog.append("slow-start"); time.sleep(1); log.append("slow-end")',
      );
      await new Promise((r) => setTimeout(r, 100));
      const fast = run(hostd, id, 'log.append("fast")');
      await Promise.all([slow, fast]);
      assert.equal(
        (await run(hostd, id, 'print(log)')).stdout,
        "['slow-start', 'slow-end', 'fast']\n",
      );
    });
  });

  test('a Python timeout raises KeyboardInterrupt, says so, exits 124 and keeps state', async () => {
    await withSandbox(hostd, async (id) => {
      await run(hostd, id, 'kept = 99');
      const started = Date.now();
      const r = await run(hostd, id, 'while True: pass', { timeout: 1 });
      assert.ok(Date.now() - started < 15_000);
      assert.equal(r.exit, 124);
      assert.match(r.stderr, /hostd: execution timed out/);
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
      const ps = await run(hostd, id, 'pgrep -x sleep | wc -l', { language: 'bash' });
      assert.equal(ps.stdout.trim(), '0');
    });
  });

  test('a client that disconnects mid-stream interrupts its exec, so the queue moves on', async () => {
    await withSandbox(hostd, async (id) => {
      const ac = new AbortController();
      const res = await fetch(`${hostd.url}/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          code: 'import time\nprint("go", flush=True)\nwhile True: time.sleep(0.1)',
        }),
        signal: ac.signal,
      });
      await res.body!.getReader().read();
      ac.abort();
      const started = Date.now();
      assert.equal((await run(hostd, id, 'print("next")')).stdout, 'next\n');
      assert.ok(
        Date.now() - started < 10_000,
        'the next exec was not stuck behind the abandoned one',
      );
    });
  });

  test('bad exec bodies are 400s and leave the sandbox working', async () => {
    await withSandbox(hostd, async (id) => {
      for (const body of [
        {},
        { code: 1 },
        { code: 'x', language: 'ruby' },
        { code: 'x', timeout: -1 },
      ]) {
        const res = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, body);
        assert.equal(res.status, 400, JSON.stringify(body));
        assert.equal(res.body.code, 'invalid_request');
      }
      assert.equal((await run(hostd, id, 'print(1)')).stdout, '1\n');
    });
  });
});

describe('failures after the stream started', () => {
  test('a VM that dies mid-exec ends the stream with stderr + exit -1 and an error; then 500; DELETE works', async () => {
    const id = await createSandbox(hostd);
    try {
      const res = await hostd.request('POST', `/v1/sandboxes/${id}/exec`, {
        code: 'import time\nprint("running", flush=True)\ntime.sleep(60)',
      });
      const reader = res.body!.getReader();
      await reader.read();
      // Kill this sandbox's QEMU from outside, as an OOM killer or a crash would.
      process.kill(await sandboxQemuPid(hostd, id), 'SIGKILL');
      const events = await readRemainingEvents(reader);
      const last = events.at(-1)!;
      assert.equal(last.type, 'exit');
      assert.equal(last.data, -1);
      assert.equal(typeof last.error, 'string');
      assert.match(String(events.at(-2)!.data), /^hostd: executor error: /);

      const again = await hostd.json<ErrorBody>('POST', `/v1/sandboxes/${id}/exec`, {
        code: '1',
      });
      assert.equal(again.status, 500);
      assert.equal(again.body.code, 'executor_error');
    } finally {
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    }
  });
});
