/**
 * Timeouts: a server silent for longer than requestTimeoutMs (before its answer, or in the
 * middle of a body) gives RequestTimeoutError and the connection is closed; an exec stream may
 * stay silent for its own timeoutMs plus requestTimeoutMs, and forever when it has no timeoutMs.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { ConnectionError, RequestTimeoutError, Sandbox, type ExecEvent } from '../src/index.js';
import { eventLine, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';

const ID = 'sbx_' + '8'.repeat(32);

/** Resolves when the client closes the connection of `raw`. */
function closed(raw: IncomingMessage): Promise<void> {
  return new Promise((resolve) => raw.socket.once('close', () => resolve()));
}

/** A pause that does not keep the test process alive once the test is over. */
function pause(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

async function collect(events: AsyncIterable<ExecEvent>): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

describe('request timeouts', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd();
  });
  after(() => fake.close());

  test('no answer within requestTimeoutMs is RequestTimeoutError, and the connection closes', async () => {
    let gone: Promise<void> | undefined;
    fake.handle((_req, _res, raw) => {
      gone = closed(raw);
    });
    const started = Date.now();
    await assert.rejects(
      Sandbox.create({ baseUrl: fake.url, requestTimeoutMs: 200 }),
      (e: unknown) => {
        assert.ok(e instanceof RequestTimeoutError);
        assert.ok(e instanceof ConnectionError);
        assert.equal(e.code, 'request_timeout');
        return true;
      },
    );
    assert.ok(Date.now() - started >= 200);
    await gone;
  });

  test('a body that stalls for longer than requestTimeoutMs is RequestTimeoutError', async () => {
    fake.handle((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":');
    });
    await assert.rejects(
      Sandbox.create({ baseUrl: fake.url, requestTimeoutMs: 200 }),
      RequestTimeoutError,
    );
  });

  test('SERVICE_REQUEST_TIMEOUT_S sets it when the option does not', async () => {
    fake.handle(() => undefined);
    const saved = process.env.SERVICE_REQUEST_TIMEOUT_S;
    process.env.SERVICE_REQUEST_TIMEOUT_S = '0.2';
    try {
      await assert.rejects(Sandbox.create({ baseUrl: fake.url }), RequestTimeoutError);
    } finally {
      if (saved === undefined) delete process.env.SERVICE_REQUEST_TIMEOUT_S;
      else process.env.SERVICE_REQUEST_TIMEOUT_S = saved;
    }
  });
});

describe('exec stream timeouts', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  /** Each exec: headers, then silence for `pauseMs`, then its events. */
  let pauseMs = 0;
  before(async () => {
    fake = await startFakeHostd(async (req, res, raw) => {
      if (req.method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ id: ID, state: 'ready' }));
      }
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.flushHeaders();
      await Promise.race([pause(pauseMs), closed(raw)]);
      if (!res.destroyed) res.end(eventLine('stdout', 'late', 0) + eventLine('exit', 0, 1));
    });
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url, requestTimeoutMs: 200 });
  });
  after(() => fake.close());

  test('a running exec may stay silent for its timeoutMs plus requestTimeoutMs', async () => {
    pauseMs = 400; // longer than requestTimeoutMs alone
    // Well within the sum: the silence ends on a timer, which a loaded host can fire late.
    const events = await collect(sandbox.exec('x', { timeoutMs: 1_000 }));
    assert.deepEqual(
      events.map((e) => e.data),
      ['late', 0],
    );
  });

  test('silence past that is RequestTimeoutError', async () => {
    pauseMs = 5_000;
    const started = Date.now();
    await assert.rejects(collect(sandbox.exec('x', { timeoutMs: 100 })), RequestTimeoutError);
    const waited = Date.now() - started;
    assert.ok(waited >= 300 && waited < 4_000, `gave up after ${waited} ms`);
  });

  test('an exec without timeoutMs waits for as long as the code runs', async () => {
    pauseMs = 600;
    const events = await collect(sandbox.exec('x'));
    assert.deepEqual(
      events.map((e) => e.data),
      ['late', 0],
    );
  });
});
