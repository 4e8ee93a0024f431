/**
 * The SDK against a real hostd (SERVICE_HOSTD_URL, SERVICE_API_KEY): create, persistent state,
 * exceptions, bash, streaming order, timeout, fork, merge, delete and the error classes a real
 * server produces. Skipped when SERVICE_HOSTD_URL is unset. Every sandbox made here is deleted
 * at the end, whatever happened.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import {
  AuthenticationError,
  InvalidRequestError,
  NotFoundError,
  Sandbox,
  SandboxNotFoundError,
  TemplateNotFoundError,
  isHostdError,
  type ExecEvent,
} from '../src/index.js';
import { LIVE_TIMEOUT_MS, skipLive } from './helpers/live.js';

const made = new Set<Sandbox>();

async function create(): Promise<Sandbox> {
  const s = await Sandbox.create();
  made.add(s);
  return s;
}

function track(sandboxes: Sandbox[]): Sandbox[] {
  for (const s of sandboxes) made.add(s);
  return sandboxes;
}

describe('SDK against a real hostd', { skip: skipLive, timeout: 10 * LIVE_TIMEOUT_MS }, () => {
  after(async () => {
    for (const s of made) {
      await s.delete().catch((e: unknown) => {
        if (!isHostdError(e, 'not_found')) throw e;
      });
    }
  });

  test(
    'create gives a ready sandbox that connect and list find',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      assert.match(s.id, /^sbx_[0-9a-f]{32}$/);
      assert.equal((await Sandbox.connect(s.id)).id, s.id);
      const info = await s.info();
      assert.equal(info.state, 'ready');
      assert.ok((await Sandbox.list()).some((i) => i.id === s.id));
    },
  );

  test('Python state persists between runs', { timeout: LIVE_TIMEOUT_MS }, async () => {
    const s = await create();
    assert.deepEqual(await s.run('x = 41\nimport json'), {
      stdout: '',
      stderr: '',
      exitCode: 0,
      displays: [],
    });
    assert.deepEqual(await s.run('print(json.dumps({"x": x + 1}))'), {
      stdout: '{"x": 42}\n',
      stderr: '',
      exitCode: 0,
      displays: [],
    });
    assert.equal(
      (await s.run('x')).stdout,
      '41\n',
      'a last expression is echoed like a notebook cell',
    );
  });

  test(
    'an uncaught exception exits 1 with a traceback, and the REPL survives',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      await s.run('kept = "yes"');
      const r = await s.run('raise ValueError("boom")');
      assert.equal(r.exitCode, 1);
      assert.match(r.stderr, /Traceback[\s\S]*ValueError: boom/);
      assert.equal((await s.run('print(kept)')).stdout, 'yes\n');
      assert.equal((await s.run('import sys; sys.exit(7)')).exitCode, 7);
    },
  );

  test(
    'bash runs in a fresh process; the filesystem persists',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      const r = await s.run('V=1; echo out; echo err >&2; echo data > /root/f.txt; exit 5', {
        language: 'bash',
      });
      assert.deepEqual(r, { stdout: 'out\n', stderr: 'err\n', exitCode: 5, displays: [] });
      assert.equal((await s.run('echo "[$V]"', { language: 'bash' })).stdout, '[]\n');
      assert.equal((await s.run('print(open("/root/f.txt").read(), end="")')).stdout, 'data\n');
    },
  );

  test(
    'exec yields events in seq order as they are produced',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      // Each line is printed only once the client has yielded the one before (it writes a
      // file the cell waits for): lines held back until the end would leave the cell waiting.
      const code = [
        'import os, sys, time',
        'for i in range(3):',
        '    print(i, flush=True)',
        '    print("e", i, file=sys.stderr, flush=True)',
        '    deadline = time.monotonic() + 120',
        "    while not os.path.exists(f'/tmp/yielded-{i}'):",
        '        if time.monotonic() > deadline:',
        "            sys.exit('held back')",
        '        time.sleep(0.01)',
      ].join('\n');
      const events: ExecEvent[] = [];
      for await (const e of s.exec(code)) {
        events.push(e);
        if (e.type === 'stdout') await s.files.write(`/tmp/yielded-${String(e.data)}`, '');
      }
      assert.deepEqual(
        events.map((e) => e.seq),
        [0, 1, 2, 3, 4, 5, 6],
      );
      // Each stream keeps its order; between stdout and stderr only seq is authoritative.
      const of = (type: string): string[] =>
        events.filter((e) => e.type === type).map((e) => String(e.data));
      assert.deepEqual(of('stdout'), ['0', '1', '2']);
      assert.deepEqual(of('stderr'), ['e 0', 'e 1', 'e 2']);
      assert.equal(events.at(-1)?.type, 'exit');
      assert.equal(events.at(-1)?.data, 0);
      for (const e of events) assert.equal(typeof e.ts, 'number');
    },
  );

  test(
    'timeoutMs interrupts the code with exit code 124',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      await s.run('alive = True');
      const r = await s.run('import time\ntime.sleep(60)', { timeoutMs: 1000 });
      assert.equal(r.exitCode, 124);
      assert.ok(r.stderr.includes('hostd: execution timed out'), r.stderr);
      assert.equal((await s.run('print(alive)')).stdout, 'True\n');
    },
  );

  test(
    'fork gives isolated children that inherit the state',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const parent = await create();
      await parent.run('x = "parent"');
      const children = track(await parent.fork(2));
      assert.equal(children.length, 2);
      assert.equal(new Set([parent.id, ...children.map((c) => c.id)]).size, 3);
      for (const c of children) assert.equal((await c.run('print(x)')).stdout, 'parent\n');
      await children[0]!.run('x = "child 0"');
      assert.equal((await children[1]!.run('print(x)')).stdout, 'parent\n');
      assert.equal((await parent.run('print(x)')).stdout, 'parent\n');
      assert.equal((await children[0]!.info()).parent_id, parent.id);
    },
  );

  test(
    "merge makes the parent adopt the winner's state and consumes the winner",
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const parent = await create();
      await parent.run('x = 0');
      const [a, b] = track(await parent.fork(2));
      await a!.run('x = 1');
      await b!.run('x = 2');
      await parent.merge(a!);
      assert.equal((await parent.run('print(x)')).stdout, '1\n');
      await assert.rejects(Sandbox.connect(a!.id), NotFoundError);
      await assert.rejects(
        parent.merge(a!.id),
        NotFoundError,
        'merging the same winner twice is 404',
      );
      assert.equal((await b!.run('print(x)')).stdout, '2\n', 'siblings are untouched');
      await assert.rejects(parent.merge(parent), InvalidRequestError);
    },
  );

  test(
    'delete removes the sandbox; a second delete is NotFoundError',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const s = await create();
      await s.delete();
      await assert.rejects(Sandbox.connect(s.id), NotFoundError);
      await assert.rejects(
        s.delete(),
        (e: unknown) => isHostdError(e, 'not_found') && (e as NotFoundError).status === 404,
      );
      await assert.rejects(s.run('1'), NotFoundError);
    },
  );

  test('the error classes a real server produces', { timeout: LIVE_TIMEOUT_MS }, async (t) => {
    await assert.rejects(Sandbox.connect('sbx_' + '0'.repeat(32)), (e: unknown) => {
      assert.ok(e instanceof SandboxNotFoundError);
      assert.ok(e instanceof NotFoundError, 'the first version’s class still catches it');
      assert.deepEqual([e.code, e.status], ['sandbox_not_found', 404]);
      return true;
    });
    await assert.rejects(Sandbox.create({ template: 'no-such-template' }), TemplateNotFoundError);
    const s = await create();
    await assert.rejects(s.fork(33), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.deepEqual([e.code, e.status], ['invalid_request', 400]);
      return true;
    });
    await assert.rejects(s.merge(s), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.code, 'merge_into_self');
      return true;
    });
    await assert.rejects(s.run('1', { timeoutMs: -5 }), InvalidRequestError);
    await assert.rejects(s.run('1', { language: 'ruby' as 'bash' }), InvalidRequestError);
    if (!process.env.SERVICE_API_KEY) {
      t.diagnostic(
        'SERVICE_API_KEY unset: assuming the server does not check keys; 401 not tested',
      );
      return;
    }
    await assert.rejects(Sandbox.create({ apiKey: 'definitely-not-a-valid-key' }), (e: unknown) => {
      assert.ok(e instanceof AuthenticationError);
      assert.equal(e.code, 'invalid_api_key');
      return true;
    });
    await assert.rejects(Sandbox.list({ apiKey: '' }), {
      name: 'AuthenticationError',
      code: 'missing_api_key',
    });
  });
});
