/**
 * Retries: 429 and 503 are sent again, after Retry-After or a backoff, at most maxRetries
 * times; nothing else is retried; an exec is retried only when it was refused before any
 * event; a one-shot upload stream never is.
 */
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import {
  InvalidRequestError,
  NotFoundError,
  RateLimitError,
  Sandbox,
  ExecutorError,
  ShuttingDownError,
  type ExecEvent,
} from '../src/index.js';
import { FIRST_BACKOFF_MS, parseRetryAfter, retryDelayMs } from '../src/retry.js';
import {
  eventLine,
  sendError,
  sendJson,
  startFakeHostd,
  type FakeHostd,
  type Handler,
} from './helpers/fake-hostd.js';

const ID = 'sbx_' + '7'.repeat(32);

/** Answers the first `refusals` requests with `status` (and `retryAfter`), then `then`. */
function refusing(
  refusals: number,
  status: number,
  code: string,
  retryAfter: string | undefined,
  then: Handler,
): Handler {
  let seen = 0;
  return (req, res, raw) => {
    if (seen++ < refusals) {
      const headers: Record<string, string> =
        retryAfter === undefined ? {} : { 'retry-after': retryAfter };
      return sendError(res, status, `refused ${seen}`, code, headers);
    }
    return then(req, res, raw);
  };
}

const created: Handler = (_req, res) => sendJson(res, 200, { id: ID, state: 'ready' });

describe('retries', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd();
  });
  after(() => fake.close());

  async function count<T>(fn: () => Promise<T>): Promise<{ value: T | unknown; requests: number }> {
    const from = fake.requests.length;
    const value = await fn().catch((e: unknown) => e);
    return { value, requests: fake.requests.length - from };
  }

  test('429 and 503 are retried after Retry-After until the request succeeds', async () => {
    fake.handle(
      refusing(
        1,
        429,
        'limit_reached',
        '0',
        refusing(1, 503, 'insufficient_resources', '0', created),
      ),
    );
    const { value, requests } = await count(() => Sandbox.create({ baseUrl: fake.url }));
    assert.ok(value instanceof Sandbox);
    assert.equal(requests, 3);
  });

  test('without Retry-After the first retry waits the first backoff', async () => {
    fake.handle(refusing(1, 503, 'shutting_down', undefined, created));
    const started = Date.now();
    const { value, requests } = await count(() => Sandbox.create({ baseUrl: fake.url }));
    assert.ok(value instanceof Sandbox);
    assert.equal(requests, 2);
    assert.ok(Date.now() - started >= FIRST_BACKOFF_MS, `retried after ${Date.now() - started} ms`);
  });

  test('after maxRetries the error goes to the caller, with its Retry-After', async () => {
    fake.handle(refusing(100, 429, 'limit_reached', '0', created));
    const { value, requests } = await count(() => Sandbox.create({ baseUrl: fake.url }));
    assert.ok(value instanceof RateLimitError);
    assert.equal(value.retryAfterMs, 0);
    assert.equal(requests, 4, 'one request and three retries');
    const once = await count(() => Sandbox.create({ baseUrl: fake.url, maxRetries: 0 }));
    assert.ok(once.value instanceof RateLimitError);
    assert.equal(once.requests, 1);
  });

  test('a Retry-After over 30 s is not waited for', async () => {
    fake.handle(refusing(100, 503, 'shutting_down', '120', created));
    const { value, requests } = await count(() => Sandbox.create({ baseUrl: fake.url }));
    assert.ok(value instanceof ShuttingDownError);
    assert.equal(value.retryAfterMs, 120_000);
    assert.equal(requests, 1);
  });

  test('no other error is retried', async () => {
    for (const [status, code, cls] of [
      [400, 'invalid_request', InvalidRequestError],
      [404, 'sandbox_not_found', NotFoundError],
      [500, 'executor_error', ExecutorError],
    ] as const) {
      fake.handle(refusing(100, status, code, '0', created));
      const { value, requests } = await count(() => Sandbox.create({ baseUrl: fake.url }));
      assert.ok(value instanceof cls, `${status}`);
      assert.equal(requests, 1, `${status}`);
    }
  });

  test('aborting during the wait rejects at once with the reason, sending nothing more', async () => {
    fake.handle(refusing(100, 503, 'shutting_down', '20', created));
    const abort = new AbortController();
    const from = fake.requests.length;
    const pending = Sandbox.create({ baseUrl: fake.url, signal: abort.signal });
    while (fake.requests.length === from) await new Promise((r) => setImmediate(r));
    abort.abort();
    await assert.rejects(pending, { name: 'AbortError' });
    assert.equal(fake.requests.length - from, 1);
  });
});

describe('exec retries', { timeout: 30_000 }, () => {
  let fake: FakeHostd;
  let sandbox: Sandbox;
  before(async () => {
    fake = await startFakeHostd();
    sandbox = await Sandbox.connect(ID, { baseUrl: fake.url });
  });
  after(() => fake.close());

  test('an exec refused with 429 before any event is sent again; a started one never', async () => {
    const stream: Handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(eventLine('stdout', 'ran', 0) + eventLine('exit', -1, 1, { error: 'the VM exited' }));
    };
    fake.handle(refusing(1, 429, 'limit_reached', '0', stream));
    const from = fake.requests.length;
    const events: ExecEvent[] = [];
    await assert.rejects(async () => {
      for await (const e of sandbox.exec('x')) events.push(e);
    }, ExecutorError);
    assert.deepEqual(
      events.map((e) => e.data),
      ['ran'],
    );
    assert.equal(fake.requests.length - from, 2, 'the 429 was retried, the failed stream was not');
  });

  test('a one-shot upload stream is not retried; bytes and uploadDir are', async () => {
    const written: Handler = (_req, res) => sendJson(res, 200, { path: '/f', size: 3 });
    fake.handle(refusing(1, 503, 'insufficient_resources', '0', written));
    let from = fake.requests.length;
    await assert.rejects(sandbox.files.write('/f', Readable.from([Buffer.from('abc')])), {
      name: 'InsufficientResourcesError',
    });
    assert.equal(fake.requests.length - from, 1);
    fake.handle(refusing(1, 503, 'insufficient_resources', '0', written));
    from = fake.requests.length;
    assert.deepEqual(await sandbox.files.write('/f', 'abc'), { path: '/f', size: 3 });
    assert.equal(fake.requests.length - from, 2);
    assert.deepEqual(
      fake.requests.slice(from).map((r) => r.body),
      ['abc', 'abc'],
    );
  });
});

describe('retryDelayMs and parseRetryAfter', () => {
  test('backoff doubles from 0.5 s up to 8 s, with up to a quarter of jitter', () => {
    const none = (): number => 0;
    assert.deepEqual(
      [0, 1, 2, 3, 4, 5].map((attempt) => retryDelayMs(503, undefined, attempt, 9, none)),
      [500, 1000, 2000, 4000, 8000, 8000],
    );
    assert.equal(
      retryDelayMs(429, undefined, 0, 9, () => 1),
      625,
    );
  });

  test('Retry-After wins, up to 30 s; other statuses and spent retries give up', () => {
    assert.equal(retryDelayMs(503, 10_000, 0, 3), 10_000);
    assert.equal(retryDelayMs(503, 30_001, 0, 3), undefined);
    assert.equal(retryDelayMs(503, 0, 3, 3), undefined);
    assert.equal(retryDelayMs(500, 0, 0, 3), undefined);
    assert.equal(retryDelayMs(502, 0, 0, 3), undefined);
  });

  test('Retry-After is seconds or an HTTP date', () => {
    const now = Date.parse('2026-11-23T10:00:00Z');
    assert.equal(parseRetryAfter('5', now), 5000);
    assert.equal(parseRetryAfter(' 0 ', now), 0);
    assert.equal(parseRetryAfter('Mon, 23 Nov 2026 10:00:07 GMT', now), 7000);
    assert.equal(parseRetryAfter('Mon, 23 Nov 2026 09:00:00 GMT', now), 0);
    assert.equal(parseRetryAfter('soon', now), undefined);
    assert.equal(parseRetryAfter(undefined, now), undefined);
  });
});
