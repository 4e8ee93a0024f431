/**
 * The `sbx` CLI, spawned as a process: help, usage errors, one-line readable errors with exit
 * status 1, exec streaming to stdout and stderr with the code's exit status, and every
 * command against a fake and then against a real hostd.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import {
  eventLine,
  sendError,
  sendJson,
  signal,
  startFakeHostd,
  within,
  type FakeHostd,
} from './helpers/fake-hostd.js';
import { Sandbox } from '../src/index.js';
import { CLI, LIVE_TIMEOUT_MS, LIVE_URL, skipLive } from './helpers/live.js';
import { CLI_SUITE_TIMEOUT_MS, cleanEnv, sbx } from './helpers/run.js';

const ID = 'sbx_' + '1'.repeat(32);
const KIDS = ['sbx_' + '2'.repeat(32), 'sbx_' + '3'.repeat(32)];
const INFO = {
  id: ID,
  state: 'ready',
  template: 'python',
  created_at: '2026-01-01T00:00:00.000Z',
  last_used_at: '2026-01-01T00:00:00.000Z',
  parent_id: null,
  busy: false,
  queued: 0,
};
const NO_STACK = /^\s+at /m;
const COMMANDS = [
  'create',
  'exec',
  'cp',
  'fork',
  'merge',
  'snapshot',
  'snapshots',
  'pause',
  'resume',
  'rm',
  'ls',
  'templates',
  'mcp',
];

describe('sbx help and usage', { timeout: CLI_SUITE_TIMEOUT_MS }, () => {
  test('--help lists every command', async () => {
    const r = await sbx(['--help']);
    assert.equal(r.code, 0);
    for (const c of [...COMMANDS, '--url', '--api-key']) assert.ok(r.stdout.includes(c), c);
  });

  for (const c of COMMANDS) {
    test(`${c} --help shows its usage`, async () => {
      const r = await sbx([c, '--help']);
      assert.equal(r.code, 0);
      assert.match(r.stdout, new RegExp(`^Usage: sbx ${c}`));
      assert.ok(r.stdout.includes('--url'));
    });
  }

  test('usage mistakes exit 2 with a hint and no stack trace', async () => {
    for (const args of [
      [],
      ['frobnicate'],
      ['exec', ID],
      ['fork', ID],
      ['fork', ID, '-n', 'two'],
      ['ls', '--bogus'],
      ['merge', ID],
    ]) {
      const r = await sbx(args);
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /^sbx: .+\nRun 'sbx( \w+)? --help' for usage\.\n$/);
      assert.doesNotMatch(r.stderr, NO_STACK);
      assert.equal(r.stdout, '');
    }
  });

  test('--version prints the package version', async () => {
    const r = await sbx(['--version']);
    assert.equal(r.code, 0);
    assert.match(r.stdout, /^\d+\.\d+\.\d+\n$/);
  });

  test('no server: one line, exit 1', async () => {
    const dead = await startFakeHostd();
    await dead.close();
    const r = await sbx(['ls', '--url', dead.url]);
    assert.equal(r.code, 1);
    assert.match(
      r.stderr,
      /^sbx: cannot connect: cannot reach hostd at http:\/\/127\.0\.0\.1:\d+: ECONNREFUSED\n$/,
    );
  });
});

describe('sbx against a fake hostd', { timeout: CLI_SUITE_TIMEOUT_MS }, () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd(async (req, res) => {
      if (req.url.includes('sbx_' + '0'.repeat(32)))
        return sendError(res, 404, `sandbox sbx_${'0'.repeat(32)} not found`);
      if (req.headers.authorization === 'Bearer bad') return sendError(res, 401, 'invalid api key');
      if (req.method === 'POST' && req.url === '/v1/sandboxes')
        return sendJson(res, 200, { id: ID, state: 'ready' });
      if (req.method === 'GET' && req.url === '/v1/sandboxes')
        return sendJson(res, 200, { sandboxes: [INFO] });
      if (req.method === 'GET') return sendJson(res, 200, { ...INFO, id: req.url.split('/')[3] });
      if (req.url.endsWith('/fork')) {
        const { n } = JSON.parse(req.body) as { n: number };
        if (n > 32) return sendError(res, 400, `n must be an integer from 1 to 32, got ${n}`);
        return sendJson(res, 200, {
          parent_id: ID,
          children: KIDS.slice(0, n).map((id) => ({ id, state: 'ready' })),
        });
      }
      if (req.url.includes('/merge_into/'))
        return sendJson(res, 200, { id: ID, state: 'ready', merged: KIDS[0] });
      if (req.method === 'DELETE') {
        res.writeHead(204);
        return void res.end();
      }
      const { code } = JSON.parse(req.body) as { code: string };
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      if (code === 'slow') {
        // Each line only once sbx has written the one before (see the test)
        for (let i = 0; i < 3; i++) {
          res.write(eventLine('stdout', String(i), i));
          slowReleased.push(await within(slowPrinted[i]!.promise, 10_000));
        }
        return void res.end(eventLine('exit', 0, 3));
      }
      if (code === 'forever') {
        res.write(eventLine('stdout', 'started', 0));
        const closed = new Promise<void>((resolve) => res.once('close', () => resolve()));
        if (await within(closed, 20_000)) foreverClosed.resolve();
        return void res.end();
      }
      if (code === 'die') {
        res.write(eventLine('stderr', 'hostd: executor error: the VM exited', 0));
        return void res.end(eventLine('exit', -1, 1, { error: 'the VM exited' }));
      }
      res.write(eventLine('stdout', `ran: ${code}`, 0));
      res.write(eventLine('stderr', 'to stderr', 1));
      res.end(eventLine('exit', 3, 2));
    });
  });
  const slowPrinted = [signal(), signal(), signal()];
  const slowReleased: boolean[] = [];
  const foreverClosed = signal();
  after(() => fake.close());
  const url = (): string[] => ['--url', fake.url];

  test('create prints the id', async () => {
    const r = await sbx(['create', '--template', 'python', ...url()]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${ID}\n`);
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), { template: 'python' });
  });

  test('SERVICE_HOSTD_URL and SERVICE_API_KEY are used, and --url and --api-key override them', async () => {
    let r = await sbx(['create'], {
      env: { SERVICE_HOSTD_URL: fake.url, SERVICE_API_KEY: 'from-env' },
    });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(fake.requests.at(-1)!.headers.authorization, 'Bearer from-env');
    r = await sbx(['--api-key', 'from-flag', 'create', '--url', fake.url], {
      env: { SERVICE_HOSTD_URL: 'http://127.0.0.1:1', SERVICE_API_KEY: 'from-env' },
    });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(fake.requests.at(-1)!.headers.authorization, 'Bearer from-flag');
    assert.match(
      String(fake.requests.at(-1)!.headers.traceparent),
      /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/,
    );
  });

  test('exec streams stdout and stderr apart and exits with the exit code', async () => {
    const r = await sbx(['exec', ID, 'print(1)', ...url()]);
    assert.equal(r.code, 3);
    assert.equal(r.stdout, 'ran: print(1)\n');
    assert.equal(r.stderr, 'to stderr\n');
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), {
      code: 'print(1)',
      language: 'python',
    });
  });

  test('exec - reads the code from stdin; --bash and --timeout reach the request', async () => {
    const r = await sbx(['exec', ID, '--bash', '--timeout', '2.5', '-', ...url()], {
      input: 'echo "from stdin"\n',
    });
    assert.equal(r.code, 3, r.stderr);
    assert.equal(r.stdout, 'ran: echo "from stdin"\n\n');
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), {
      code: 'echo "from stdin"\n',
      language: 'bash',
      timeout: 2.5,
    });
  });

  test('exec writes each line as it arrives', async () => {
    // The fake sends each line only once sbx has written the one before to its stdout: an sbx
    // that held lines back until the stream ended would leave it waiting.
    let lines = 0;
    const r = await sbx(['exec', ID, 'slow', ...url()], {
      onStdout: (chunk) => {
        for (const ch of chunk) if (ch === '\n') slowPrinted[lines++]?.resolve();
      },
    });
    assert.equal(r.code, 0);
    assert.equal(r.stdout, '0\n1\n2\n');
    assert.deepEqual(slowReleased, [true, true, true]);
  });

  test('Ctrl-C interrupts exec: the connection closes and sbx exits 130', async () => {
    const child = spawn(process.execPath, [CLI, 'exec', ID, 'forever', ...url()], {
      env: cleanEnv(),
    });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => {
      out += c;
      if (out === 'started\n') child.kill('SIGINT');
    });
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    assert.equal(code, 130);
    assert.ok(await within(foreverClosed.promise, 20_000), 'the fake saw the connection close');
  });

  test('an executor error in the stream: its lines, then one sbx line, exit 1', async () => {
    const r = await sbx(['exec', ID, 'die', ...url()]);
    assert.equal(r.code, 1);
    assert.equal(
      r.stderr,
      'hostd: executor error: the VM exited\nsbx: executor error: the VM exited\n',
    );
  });

  test('fork prints the children one per line; merge prints the parent; rm prints nothing', async () => {
    let r = await sbx(['fork', ID, '-n', '2', ...url()]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${KIDS[0]}\n${KIDS[1]}\n`);
    assert.equal(fake.requests.at(-1)!.body, '{"n":2}');
    r = await sbx(['merge', ID, KIDS[0]!, ...url()]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${ID}\n`);
    assert.equal(fake.requests.at(-1)!.url, `/v1/sandboxes/${ID}/merge_into/${KIDS[0]}`);
    r = await sbx(['rm', ID, KIDS[1]!, ...url()]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '');
    assert.deepEqual(
      fake.requests
        .filter((q) => q.method === 'DELETE')
        .slice(-2)
        .map((q) => q.url),
      [`/v1/sandboxes/${ID}`, `/v1/sandboxes/${KIDS[1]}`],
    );
  });

  test('ls prints a table, ids with -q, JSON with --json', async () => {
    let r = await sbx(['ls', ...url()]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^ID\s+TEMPLATE\s+STATE\s+BUSY\s+PARENT\s+CREATED\n/);
    assert.ok(r.stdout.includes(`${ID}  python`));
    r = await sbx(['ls', '-q', ...url()]);
    assert.equal(r.stdout, `${ID}\n`);
    r = await sbx(['ls', '--json', ...url()]);
    assert.deepEqual(JSON.parse(r.stdout), [INFO]);
  });

  test('API errors are one readable line and exit 1', async () => {
    const missing = 'sbx_' + '0'.repeat(32);
    const cases: Array<[string[], string]> = [
      [['rm', missing], `sbx: not found: sandbox ${missing} not found\n`],
      [['rm', missing, ID, missing], `sbx: not found: sandbox ${missing} not found\n`.repeat(2)],
      [['exec', missing, '1'], `sbx: not found: sandbox ${missing} not found\n`],
      [
        ['fork', ID, '-n', '33'],
        'sbx: invalid request: n must be an integer from 1 to 32, got 33\n',
      ],
      [['ls', '--api-key', 'bad'], 'sbx: authentication failed: invalid api key\n'],
    ];
    for (const [args, stderr] of cases) {
      const r = await sbx([...args, ...url()]);
      assert.equal(r.code, 1, args.join(' '));
      assert.equal(r.stderr, stderr);
      assert.equal(r.stdout, '');
    }
  });
});

describe('sbx against a real hostd', { skip: skipLive, timeout: 10 * LIVE_TIMEOUT_MS }, () => {
  const made = new Set<string>();
  const env = { SERVICE_HOSTD_URL: LIVE_URL, SERVICE_API_KEY: process.env.SERVICE_API_KEY };
  const live = (args: string[], input?: string) =>
    sbx(args, { env, input, timeoutMs: LIVE_TIMEOUT_MS });
  async function create(): Promise<string> {
    const r = await live(['create']);
    assert.equal(r.code, 0, r.stderr);
    const id = r.stdout.trim();
    assert.match(id, /^sbx_[0-9a-f]{32}$/);
    made.add(id);
    return id;
  }
  after(async () => {
    for (const id of made) await live(['rm', id]);
  });

  test(
    'create, exec with persistent state, exceptions, bash, stdin',
    { timeout: LIVE_TIMEOUT_MS },
    async () => {
      const id = await create();
      assert.equal((await live(['exec', id, 'x = 41'])).code, 0);
      assert.deepEqual(await live(['exec', id, 'print(x + 1)']), {
        code: 0,
        signal: null,
        stdout: '42\n',
        stderr: '',
      });
      const boom = await live(['exec', id, '1/0']);
      assert.equal(boom.code, 1);
      assert.match(boom.stderr, /ZeroDivisionError/);
      const bash = await live(['exec', id, '--bash', 'echo out; echo err >&2; exit 4']);
      assert.deepEqual([bash.code, bash.stdout, bash.stderr], [4, 'out\n', 'err\n']);
      assert.equal((await live(['exec', id, '-'], 'print(x * 2)\n')).stdout, '82\n');
      const slow = await live(['exec', id, '--timeout', '1', 'import time; time.sleep(30)']);
      assert.equal(slow.code, 124);
    },
  );

  test('exec streams lines as they are produced', { timeout: LIVE_TIMEOUT_MS }, async () => {
    const id = await create();
    const sandbox = await Sandbox.connect(id);
    // Each line is printed only once sbx has written the one before (the test then writes a
    // file the cell waits for): lines held back until the end would leave the cell waiting.
    const code = [
      'import os, sys, time',
      'for i in range(3):',
      '    print(i, flush=True)',
      '    deadline = time.monotonic() + 60',
      "    while not os.path.exists(f'/tmp/printed-{i}'):",
      '        if time.monotonic() > deadline:',
      "            sys.exit('held back')",
      '        time.sleep(0.01)',
    ].join('\n');
    let lines = 0;
    const writes: Promise<unknown>[] = [];
    const r = await sbx(['exec', id, code], {
      env,
      timeoutMs: LIVE_TIMEOUT_MS,
      onStdout: (chunk) => {
        for (const ch of chunk)
          if (ch === '\n') writes.push(sandbox.files.write(`/tmp/printed-${lines++}`, ''));
      },
    });
    await Promise.all(writes);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '0\n1\n2\n');
  });

  test('fork, merge, rm, ls', { timeout: LIVE_TIMEOUT_MS }, async () => {
    const id = await create();
    await live(['exec', id, 'v = "parent"']);
    const fork = await live(['fork', id, '-n', '2']);
    assert.equal(fork.code, 0, fork.stderr);
    const kids = fork.stdout.trim().split('\n');
    kids.forEach((k) => made.add(k));
    assert.equal(kids.length, 2);
    assert.equal((await live(['exec', kids[0]!, 'print(v)'])).stdout, 'parent\n');
    await live(['exec', kids[0]!, 'v = "winner"']);
    const merge = await live(['merge', id, kids[0]!]);
    assert.deepEqual([merge.code, merge.stdout], [0, `${id}\n`]);
    assert.equal((await live(['exec', id, 'print(v)'])).stdout, 'winner\n');
    const ls = await live(['ls', '-q']);
    assert.ok(ls.stdout.split('\n').includes(id));
    assert.ok(!ls.stdout.split('\n').includes(kids[0]!));
    assert.equal((await live(['rm', id, kids[1]!])).code, 0);
    const partly = await live(['rm', kids[0]!, kids[1]!]);
    assert.equal(partly.code, 1);
    const lines = partly.stderr.trimEnd().split('\n');
    assert.equal(lines.length, 2, partly.stderr);
    for (const line of lines) assert.ok(line.startsWith('sbx: not found: '), line);
    const again = await live(['rm', id]);
    assert.equal(again.code, 1);
    assert.ok(again.stderr.startsWith('sbx: not found: '), again.stderr);
  });

  test('errors: invalid request, wrong key', { timeout: LIVE_TIMEOUT_MS }, async (t) => {
    const id = await create();
    const fork = await live(['fork', id, '-n', '33']);
    assert.equal(fork.code, 1);
    assert.ok(fork.stderr.startsWith('sbx: invalid request: '), fork.stderr);
    assert.equal(fork.stderr.split('\n').length, 2, 'one line');
    if (!process.env.SERVICE_API_KEY) {
      t.diagnostic(
        'SERVICE_API_KEY unset: assuming the server does not check keys; 401 not tested',
      );
      return;
    }
    const bad = await live(['ls', '--api-key', 'wrong-key']);
    assert.equal(bad.code, 1);
    assert.ok(bad.stderr.startsWith('sbx: authentication failed: '), bad.stderr);
  });
});
