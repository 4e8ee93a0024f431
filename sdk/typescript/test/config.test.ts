/**
 * Configuration and headers: SERVICE_HOSTD_URL, SERVICE_API_KEY, SERVICE_REQUEST_TIMEOUT_S and
 * SERVICE_MAX_RETRIES with explicit options winning, the bearer token, content-type only with a
 * body, and the paths and bodies of every sandbox call.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DEFAULT_BASE_URL, Sandbox, resolveConfig, type ClientConfig } from '../src/index.js';
import { defaultHandler, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';

const ID = 'sbx_' + 'd'.repeat(32);
const CHILD = 'sbx_' + 'e'.repeat(32);

const DEFAULTS: ClientConfig = {
  baseUrl: DEFAULT_BASE_URL,
  apiKey: undefined,
  requestTimeoutMs: 60_000,
  maxRetries: 3,
};

describe('resolveConfig', () => {
  test('defaults to 127.0.0.1:7070, no key, a 60 s request timeout and 3 retries', () => {
    assert.deepEqual(resolveConfig({}, {}), DEFAULTS);
    assert.equal(DEFAULT_BASE_URL, 'http://127.0.0.1:7070');
  });

  test('reads SERVICE_HOSTD_URL, SERVICE_API_KEY, SERVICE_REQUEST_TIMEOUT_S, SERVICE_MAX_RETRIES', () => {
    const env = {
      SERVICE_HOSTD_URL: 'http://h:1/',
      SERVICE_API_KEY: 'k1',
      SERVICE_REQUEST_TIMEOUT_S: '2.5',
      SERVICE_MAX_RETRIES: '0',
    };
    assert.deepEqual(resolveConfig({}, env), {
      baseUrl: 'http://h:1',
      apiKey: 'k1',
      requestTimeoutMs: 2500,
      maxRetries: 0,
    });
    assert.equal(resolveConfig({}, { SERVICE_REQUEST_TIMEOUT_S: '0' }).requestTimeoutMs, 0);
  });

  test('explicit options win over the environment', () => {
    const env = {
      SERVICE_HOSTD_URL: 'http://h:1',
      SERVICE_API_KEY: 'k1',
      SERVICE_REQUEST_TIMEOUT_S: '9',
      SERVICE_MAX_RETRIES: '9',
    };
    const opts = {
      baseUrl: 'https://x.example/api/',
      apiKey: 'k2',
      requestTimeoutMs: 0,
      maxRetries: 1,
    };
    assert.deepEqual(resolveConfig(opts, env), {
      baseUrl: 'https://x.example/api',
      apiKey: 'k2',
      requestTimeoutMs: 0,
      maxRetries: 1,
    });
    assert.equal(resolveConfig({ apiKey: '' }, env).apiKey, undefined, 'an empty key sends none');
  });

  test('empty variables count as unset; malformed values are TypeErrors', () => {
    const empty = {
      SERVICE_HOSTD_URL: ' ',
      SERVICE_API_KEY: '',
      SERVICE_REQUEST_TIMEOUT_S: '',
      SERVICE_MAX_RETRIES: ' ',
    };
    assert.deepEqual(resolveConfig({}, empty), DEFAULTS);
    assert.throws(() => resolveConfig({ baseUrl: 'not a url' }, {}), TypeError);
    assert.throws(() => resolveConfig({ baseUrl: 'ftp://x' }, {}), TypeError);
    assert.throws(() => resolveConfig({}, { SERVICE_REQUEST_TIMEOUT_S: 'soon' }), TypeError);
    assert.throws(() => resolveConfig({}, { SERVICE_REQUEST_TIMEOUT_S: '-1' }), TypeError);
    assert.throws(() => resolveConfig({}, { SERVICE_MAX_RETRIES: '1.5' }), TypeError);
    assert.throws(() => resolveConfig({ maxRetries: -1 }, {}), TypeError);
    assert.throws(() => resolveConfig({ requestTimeoutMs: Number.NaN }, {}), TypeError);
  });
});

describe('requests', () => {
  let fake: FakeHostd;
  const saved = { url: process.env.SERVICE_HOSTD_URL, key: process.env.SERVICE_API_KEY };
  before(async () => {
    fake = await startFakeHostd((req, res) => {
      const json = (body: unknown): void => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      if (req.method === 'POST' && req.url === '/v1/sandboxes')
        return json({ id: ID, state: 'ready' });
      if (req.url.endsWith('/fork'))
        return json({ parent_id: ID, children: [{ id: CHILD, state: 'ready' }] });
      if (req.url.includes('/merge_into/')) return json({ id: ID, state: 'ready', merged: CHILD });
      if (req.method === 'GET' && req.url === '/v1/sandboxes') return json({ sandboxes: [] });
      if (req.url.endsWith('/logs')) {
        res.writeHead(200, { 'content-type': 'text/plain' });
        return void res.end('console tail\n');
      }
      if (req.method === 'DELETE') {
        res.writeHead(204);
        return void res.end();
      }
      return defaultHandler(req, res, undefined as never);
    });
  });
  after(async () => {
    if (saved.url === undefined) delete process.env.SERVICE_HOSTD_URL;
    else process.env.SERVICE_HOSTD_URL = saved.url;
    if (saved.key === undefined) delete process.env.SERVICE_API_KEY;
    else process.env.SERVICE_API_KEY = saved.key;
    await fake.close();
  });

  test('use the environment when no options are given', async () => {
    process.env.SERVICE_HOSTD_URL = fake.url;
    process.env.SERVICE_API_KEY = 'env-key';
    const s = await Sandbox.create();
    assert.equal(s.id, ID);
    const req = fake.requests.at(-1)!;
    assert.equal(req.headers.authorization, 'Bearer env-key');
    assert.equal(req.headers['content-type'], 'application/json');
    assert.equal(req.body, '{}');
  });

  test('explicit apiKey overrides SERVICE_API_KEY; no key sends no Authorization', async () => {
    process.env.SERVICE_HOSTD_URL = fake.url;
    process.env.SERVICE_API_KEY = 'env-key';
    await Sandbox.create({ apiKey: 'explicit' });
    assert.equal(fake.requests.at(-1)!.headers.authorization, 'Bearer explicit');
    delete process.env.SERVICE_API_KEY;
    await Sandbox.create();
    assert.equal(fake.requests.at(-1)!.headers.authorization, undefined);
  });

  test('every call has the documented method, path and body; content-type only with a body', async () => {
    const start = fake.requests.length;
    const s = await Sandbox.create({ baseUrl: fake.url, apiKey: 'k', template: 'python' });
    const connected = await Sandbox.connect(ID, { baseUrl: fake.url, apiKey: 'k' });
    assert.equal(connected.id, ID);
    const info = await s.info();
    assert.equal(info.template, 'python');
    const children = await s.fork(1);
    assert.deepEqual(
      children.map((c) => c.id),
      [CHILD],
    );
    await s.merge(children[0]!);
    await s.merge(CHILD);
    assert.deepEqual(await Sandbox.list({ baseUrl: fake.url, apiKey: 'k' }), []);
    assert.equal(await s.logs(), 'console tail\n');
    await s.delete();
    const seen = fake.requests
      .slice(start)
      .map((r) => [r.method, r.url, r.body, r.headers['content-type'] ?? null]);
    assert.deepEqual(seen, [
      ['POST', '/v1/sandboxes', '{"template":"python"}', 'application/json'],
      ['GET', `/v1/sandboxes/${ID}`, '', null],
      ['GET', `/v1/sandboxes/${ID}`, '', null],
      ['POST', `/v1/sandboxes/${ID}/fork`, '{"n":1}', 'application/json'],
      ['POST', `/v1/sandboxes/${ID}/merge_into/${CHILD}`, '', null],
      ['POST', `/v1/sandboxes/${ID}/merge_into/${CHILD}`, '', null],
      ['GET', '/v1/sandboxes', '', null],
      ['GET', `/v1/sandboxes/${ID}/logs`, '', null],
      ['DELETE', `/v1/sandboxes/${ID}`, '', null],
    ]);
    for (const r of fake.requests.slice(start)) assert.equal(r.headers.authorization, 'Bearer k');
    assert.equal(String(s), ID);
    assert.equal(JSON.stringify({ s }), `{"s":{"id":"${ID}"}}`);
  });

  test('a base URL with a path prefix keeps it', async () => {
    fake.handle((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: ID, state: 'ready', seen: req.url }));
    });
    await Sandbox.create({ baseUrl: `${fake.url}/prefix/` });
    assert.equal(fake.requests.at(-1)!.url, '/prefix/v1/sandboxes');
  });
});
