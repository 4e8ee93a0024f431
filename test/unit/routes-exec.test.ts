/**
 * Route tests of `POST /v1/sandboxes/{id}/exec` (docs/api.md, Exec): body validation as
 * `400 invalid_request` that leaves the sandbox working, the NDJSON stream's headers, and the
 * queue cap's 429. On the fake hypervisor through `inject()` (its exec language is in
 * test/helpers/fake-hypervisor.ts); what Python does is the integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { eventually } from '../../testkit/eventually.js';
import { hang } from '../helpers/manager.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('POST /v1/sandboxes/{id}/exec', () => {
  let s: TestServer;
  let id: string;
  before(async () => {
    s = await startServer();
    id = (await s.manager.create({})).id;
  });
  after(() => s.close());

  const exec = (body: unknown, sandbox = id) =>
    s.inject({ method: 'POST', url: `/v1/sandboxes/${sandbox}/exec`, payload: body as object });
  const lines = (body: string): { type: string; data: unknown }[] =>
    body
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as { type: string; data: unknown });

  test('streams NDJSON events, uncached, ending with the exit', async () => {
    const res = await exec({ code: 'print hello' });
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['content-type'], 'application/x-ndjson');
    assert.equal(res.headers['cache-control'], 'no-store');
    assert.equal(res.headers['x-content-type-options'], 'nosniff');
    const events = lines(res.body);
    assert.deepEqual(events.at(-1), { ...events.at(-1), type: 'exit', data: 0 });
    assert.ok(
      events.some((e) => e.type === 'stdout' && e.data === 'hello'),
      res.body,
    );
  });

  test('bad bodies are 400 invalid_request and leave the sandbox working', async () => {
    await exec({ code: 'set v 7' });
    for (const body of [
      {},
      { code: 1 },
      { code: 'x', language: 'ruby' },
      { code: 'x', timeout: -1 },
      { code: 'x', timeout: 86_401 },
      { code: 'x', timeout_ms: 5 },
      { code: 'x', cwd: 'relative' },
      { code: 'x', env: { 'A-B': '1' } },
      { code: 'x', display: 'yes' },
      { code: 'x', context: '../c' },
      { code: 'x', language: 'bash', context: 'c1' },
      { code: 'x', language: 'bash', notebook: true },
      [],
    ]) {
      const res = await exec(body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
    }
    assert.ok(lines((await exec({ code: 'get v' })).body).some((e) => e.data === '7'));
  });

  test('a context the sandbox lacks is 404 context_not_found before the stream', async () => {
    const res = await exec({ code: 'print 1', context: 'nope' });
    assert.equal(res.statusCode, 404);
    assert.equal(errorBody(res).code, Errors.contextNotFound.code);
  });

  test('past SERVICE_MAX_QUEUED_EXECS, 429 limit_reached with Retry-After', async () => {
    const other = (await s.manager.create({})).id;
    const running = await hang(s.manager, other);
    const queued = Array.from({ length: 3 }, () => exec({ code: 'print q' }, other));
    try {
      await eventually('three execs queued', () => s.manager.describe(other).queued === 3);
      const res = await exec({ code: 'print 1' }, other);
      assert.equal(res.statusCode, 429);
      assert.equal(errorBody(res).code, Errors.queueFull.code);
      assert.equal(res.headers['retry-after'], String(Errors.queueFull.retryAfterS));
    } finally {
      running.stop();
      await Promise.all(queued);
    }
  });

  test('every route of this area was exercised', () => assertAreaCovered('exec'));
});
