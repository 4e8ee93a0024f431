/**
 * Route tests of the service routes (docs/api.md, Authentication and Metrics): liveness needs no
 * key, metrics do, and how keys are taken. On the fake hypervisor through `inject()`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { capturedLog } from '../helpers/manager.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { API_KEY, errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('with API keys', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer({}, undefined, { auth: { kind: 'keys', keys: ['key-one', API_KEY] } });
  });
  after(() => s.close());

  test('GET /v1/healthz answers ok in plain text, with or without a key', async () => {
    for (const res of [
      await s.inject({ method: 'GET', url: '/v1/healthz' }),
      await s.app.inject({ method: 'GET', url: '/v1/healthz' }),
    ]) {
      assert.equal(res.statusCode, 200);
      assert.equal(res.body, 'ok');
      assert.match(String(res.headers['content-type']), /^text\/plain/);
    }
  });

  test('GET /metrics is Prometheus text with the sandbox and pool gauges, behind the key', async () => {
    const res = await s.inject({ method: 'GET', url: '/metrics' });
    assert.equal(res.statusCode, 200);
    assert.match(String(res.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    assert.match(res.body, /^hostd_sandboxes_alive \d+$/m);
    assert.match(res.body, /^hostd_pool_ready\{template="python"\} \d+$/m);
    const bare = await s.app.inject({ method: 'GET', url: '/metrics' });
    assert.equal(bare.statusCode, 401);
    assert.equal(errorBody(bare).code, Errors.missingApiKey.code);
  });

  test('any listed key works; the scheme is case-insensitive, the key is not', async () => {
    for (const authorization of ['Bearer key-one', `Bearer ${API_KEY}`, 'bearer key-one']) {
      const res = await s.inject({
        method: 'GET',
        url: '/v1/sandboxes',
        headers: { authorization },
      });
      assert.equal(res.statusCode, 200, authorization);
    }
    const res = await s.inject({
      method: 'GET',
      url: '/v1/sandboxes',
      headers: { authorization: 'Bearer KEY-ONE' },
    });
    assert.equal(res.statusCode, 401);
    assert.deepEqual(errorBody(res), {
      error: Errors.invalidApiKey.message(),
      code: Errors.invalidApiKey.code,
    });
  });

  test('a 401 comes before the body is read: an oversized body is not a 413', async () => {
    const res = await s.app.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      headers: { 'content-type': 'application/json', 'content-length': String(64 << 20) },
      payload: '{}',
    });
    assert.equal(res.statusCode, 401);
    assert.equal(errorBody(res).code, Errors.missingApiKey.code);
    const keyed = await s.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      headers: { 'content-type': 'application/json', 'content-length': String(64 << 20) },
      payload: '{}',
    });
    assert.equal(keyed.statusCode, 413, 'with the key, the same request is too large');
    assert.equal(errorBody(keyed).code, Errors.bodyTooLarge.code);
  });

  test('every route of this area was exercised', () => assertAreaCovered('service'));
});

test('keys never reach the log, whether they are accepted or refused', async () => {
  const { log, lines } = capturedLog();
  const s = await startServer({}, log, { auth: { kind: 'keys', keys: ['key-one-secret'] } });
  try {
    for (const authorization of ['Bearer key-one-secret', 'Bearer key-two-secret']) {
      for (const [method, url] of [
        ['GET', '/v1/sandboxes'],
        ['POST', '/v1/sandboxes/sbx_x/exec'],
        ['GET', '/v1/nothing'],
      ] as const) {
        await s.inject({ method, url, headers: { authorization } });
      }
    }
    assert.ok(lines.length > 0, 'hostd logged at debug level');
    const text = JSON.stringify(lines);
    assert.ok(!text.includes('key-one-secret') && !text.includes('key-two-secret'), text);
  } finally {
    await s.close();
  }
});

describe('with auth off (loopback and no keys, or SERVICE_AUTH_DISABLED=1)', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer({}, undefined, { auth: { kind: 'open', why: 'disabled' } });
  });
  after(() => s.close());

  test('requests get in without a key, and a key is not checked', async () => {
    assert.equal((await s.app.inject({ method: 'GET', url: '/v1/sandboxes' })).statusCode, 200);
    assert.equal((await s.app.inject({ method: 'GET', url: '/metrics' })).statusCode, 200);
    const any = await s.app.inject({
      method: 'GET',
      url: '/v1/sandboxes',
      headers: { authorization: 'Bearer whatever' },
    });
    assert.equal(any.statusCode, 200);
  });
});
