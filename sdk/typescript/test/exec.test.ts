/**
 * The exec stream against a scripted fake: NDJSON split across chunks, events put in seq
 * order, yielded as they arrive, the in-stream failure report and a missing exit event raising
 * ExecutorError, aborts and early exits closing the connection, and run()'s collected output.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { ExecutorError, Sandbox, isHostdError, type ExecEvent } from '../src/index.js';
import {
  defaultHandler,
  eventLine,
  signal,
  sleep,
  startFakeHostd,
  within,
  type FakeHostd,
  type Handler,
} from './helpers/fake-hostd.js';

const ID = 'sbx_' + 'a'.repeat(32);

/** Answers exec requests by writing `parts`. */
function execScript(parts: string[]): Handler {
  return (req, res) => {
    if (!req.url.endsWith('/exec')) return defaultHandler(req, res, undefined as never);
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    for (const part of parts) res.write(part);
    res.end();
  };
}

/** Waits until the client closes the connection, at most `ms`. */
function untilClosed(raw: IncomingMessage, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    raw.socket.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

async function collect(events: AsyncIterable<ExecEvent>): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

describe('exec stream', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  before(async () => {
    fake = await startFakeHostd();
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url });
  });
  after(() => fake.close());

  test('sends code, language and timeout in seconds, and yields the events', async () => {
    fake.handle(execScript([eventLine('stdout', 'hi', 0), eventLine('exit', 0, 1)]));
    const events = await collect(
      sandbox.exec('print("hi")', { language: 'bash', timeoutMs: 1500 }),
    );
    assert.deepEqual(
      events.map((e) => [e.type, e.data, e.seq]),
      [
        ['stdout', 'hi', 0],
        ['exit', 0, 1],
      ],
    );
    const req = fake.requests.at(-1)!;
    assert.equal(req.method, 'POST');
    assert.equal(req.url, `/v1/sandboxes/${ID}/exec`);
    assert.deepEqual(JSON.parse(req.body), { code: 'print("hi")', language: 'bash', timeout: 1.5 });
    assert.equal(req.headers['content-type'], 'application/json');
  });

  test('omits language and timeout when not given', async () => {
    fake.handle(execScript([eventLine('exit', 0, 0)]));
    await collect(sandbox.exec('1'));
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), { code: '1' });
  });

  test('sends env, cwd and display as docs/api.md names them', async () => {
    fake.handle(execScript([eventLine('exit', 0, 0)]));
    await collect(sandbox.exec('1', { env: { A: '1', B: '' }, cwd: '/tmp', display: true }));
    assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body), {
      code: '1',
      env: { A: '1', B: '' },
      cwd: '/tmp',
      display: true,
    });
  });

  test('reassembles lines split across chunks, including a multi-byte character', async () => {
    const line = eventLine('stdout', 'héllo wörld', 0);
    const bytes = Buffer.from(line + eventLine('exit', 0, 1));
    const cut = bytes.indexOf(Buffer.from('é')) + 1; // inside the two bytes of é
    fake.handle(async (req, res) => {
      if (!req.url.endsWith('/exec')) return defaultHandler(req, res, undefined as never);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(bytes.subarray(0, cut));
      await sleep(30);
      res.write(bytes.subarray(cut, cut + 5));
      await sleep(30);
      res.end(bytes.subarray(cut + 5));
    });
    const events = await collect(sandbox.exec('x'));
    assert.deepEqual(
      events.map((e) => e.data),
      ['héllo wörld', 0],
    );
  });

  test('puts events that arrive out of order back in seq order', async () => {
    fake.handle(
      execScript([
        eventLine('stdout', 'b', 1),
        eventLine('stderr', 'c', 2),
        eventLine('stdout', 'a', 0),
        eventLine('exit', 3, 4),
        eventLine('stdout', 'd', 3),
      ]),
    );
    const events = await collect(sandbox.exec('x'));
    assert.deepEqual(
      events.map((e) => `${e.seq}:${e.type}:${e.data}`),
      ['0:stdout:a', '1:stdout:b', '2:stderr:c', '3:stdout:d', '4:exit:3'],
    );
  });

  test('yields each line as it arrives, not when the stream ends', async () => {
    // The fake sends each line only once the client has yielded the one before: a client
    // that held lines back until the stream ended would leave it waiting.
    const yielded = [signal(), signal(), signal()];
    const releasedByClient: boolean[] = [];
    fake.handle(async (req, res) => {
      if (!req.url.endsWith('/exec')) return defaultHandler(req, res, undefined as never);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      for (let i = 0; i < 3; i++) {
        res.write(eventLine('stdout', String(i), i));
        releasedByClient.push(await within(yielded[i]!.promise, 10_000));
      }
      res.end(eventLine('exit', 0, 3));
    });
    for await (const e of sandbox.exec('x')) if (e.type === 'stdout') yielded[e.seq]!.resolve();
    assert.deepEqual(releasedByClient, [true, true, true]);
  });

  test('an exit event with error raises ExecutorError after the lines before it', async () => {
    fake.handle(
      execScript([
        eventLine('stdout', 'partial', 0),
        eventLine('stderr', 'hostd: executor error: the VM exited (signal SIGKILL)', 1),
        eventLine('exit', -1, 2, { error: 'the VM exited (signal SIGKILL)' }),
      ]),
    );
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const e of sandbox.exec('x')) seen.push(String(e.data));
      })(),
      (e: unknown) => {
        assert.ok(e instanceof ExecutorError);
        assert.ok(isHostdError(e, 'executor_error'));
        assert.equal(e.message, 'the VM exited (signal SIGKILL)');
        assert.equal(e.status, undefined);
        assert.equal(e.event?.data, -1);
        return true;
      },
    );
    assert.deepEqual(seen, ['partial', 'hostd: executor error: the VM exited (signal SIGKILL)']);
  });

  test('run() raises ExecutorError for the in-stream failure report too', async () => {
    fake.handle(
      execScript([eventLine('exit', -1, 0, { error: 'the guest agent did not respond' })]),
    );
    await assert.rejects(sandbox.run('x'), {
      name: 'ExecutorError',
      code: 'executor_error',
      message: 'the guest agent did not respond',
    });
  });

  test('a stream that ends without an exit event raises ExecutorError', async () => {
    fake.handle(execScript([eventLine('stdout', 'a', 0)]));
    await assert.rejects(collect(sandbox.exec('x')), {
      name: 'ExecutorError',
      code: 'executor_error',
    });
  });

  test('a connection that breaks mid-stream raises ExecutorError', async () => {
    const gotFirst = signal();
    fake.handle(async (req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(eventLine('stdout', 'a', 0));
      await within(gotFirst.promise, 10_000); // mid-stream: the client has the first event
      res.destroy();
    });
    const events = sandbox.exec('x')[Symbol.asyncIterator]();
    assert.equal((await events.next()).value?.data, 'a');
    gotFirst.resolve();
    await assert.rejects(
      (async () => {
        while (!(await events.next()).done);
      })(),
      { name: 'ExecutorError' },
    );
  });

  test('a malformed line raises ExecutorError', async () => {
    fake.handle(execScript(['not json\n', eventLine('exit', 0, 0)]));
    await assert.rejects(collect(sandbox.exec('x')), {
      name: 'ExecutorError',
      code: 'executor_error',
    });
  });

  test('500 before the stream is ExecutorError with status 500', async () => {
    fake.handle((_req, res) => {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: 'the VM failed to start: qemu exited' }));
    });
    await assert.rejects(sandbox.run('x'), {
      name: 'ExecutorError',
      status: 500,
      message: 'the VM failed to start: qemu exited',
    });
  });

  test('unknown event types are skipped', async () => {
    fake.handle(
      execScript([
        eventLine('progress', 'x', 0),
        eventLine('stdout', 'a', 1),
        eventLine('exit', 0, 2),
      ]),
    );
    assert.deepEqual(
      (await collect(sandbox.exec('x'))).map((e) => e.type),
      ['stdout', 'exit'],
    );
  });

  test('run() joins lines with a trailing newline each and calls the callbacks as lines arrive', async () => {
    fake.handle(
      execScript([
        eventLine('stdout', 'one', 0),
        eventLine('stderr', 'warn', 1),
        eventLine('stdout', 'two', 2),
        eventLine('stdout', '', 3),
        eventLine('exit', 3, 4),
      ]),
    );
    const out: string[] = [];
    const err: string[] = [];
    const result = await sandbox.run('x', {
      onStdout: (l) => out.push(l),
      onStderr: (l) => err.push(l),
    });
    assert.deepEqual(result, {
      stdout: 'one\ntwo\n\n',
      stderr: 'warn\n',
      exitCode: 3,
      displays: [],
    });
    assert.deepEqual(out, ['one', 'two', '']);
    assert.deepEqual(err, ['warn']);
  });

  test('run() of code with no output gives empty strings', async () => {
    fake.handle(execScript([eventLine('exit', 0, 0)]));
    assert.deepEqual(await sandbox.run('x = 1'), {
      stdout: '',
      stderr: '',
      exitCode: 0,
      displays: [],
    });
  });

  test('aborting the signal aborts the request mid-stream and closes the connection', async () => {
    const closed = signal();
    fake.handle(async (_req, res, raw) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(eventLine('stdout', 'first', 0));
      raw.socket.on('close', closed.resolve);
      // Without the abort the stream would end normally, with no AbortError
      await untilClosed(raw, 10_000);
      res.end(eventLine('exit', 0, 1));
    });
    const abort = new AbortController();
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const e of sandbox.exec('x', { signal: abort.signal })) {
          seen.push(String(e.data));
          abort.abort();
        }
      })(),
      { name: 'AbortError' },
    );
    assert.deepEqual(seen, ['first']);
    await closed.promise; // the server sees the connection close
  });

  test('an already aborted signal sends nothing', async () => {
    const count = fake.requests.length;
    await assert.rejects(sandbox.run('x', { signal: AbortSignal.abort() }), { name: 'AbortError' });
    assert.equal(fake.requests.length, count);
  });

  test('leaving the loop early closes the connection', async () => {
    const closed = signal();
    fake.handle(async (_req, res, raw) => {
      raw.socket.on('close', closed.resolve);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(eventLine('stdout', 'first', 0));
      await untilClosed(raw, 10_000);
      res.end();
    });
    for await (const e of sandbox.exec('x')) {
      assert.equal(e.data, 'first');
      break;
    }
    await closed.promise; // the server sees the connection close
  });
});
