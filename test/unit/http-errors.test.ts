/**
 * Every answer comes from the error registry, whatever the client sends: bodies nested 200,000
 * deep, ids of any length or bytes, URLs and headers Node's parser refuses. Route-level, on the
 * fake hypervisor through `inject()` (test/helpers/server.ts), except for what only a real socket
 * reaches (Node's HTTP parser).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect as tcpConnect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

const deep = (depth: number): string => `{"n":${'['.repeat(depth)}${']'.repeat(depth)}}`;
const nestedIn = (field: string, depth: number): string =>
  `{"${field}":${'['.repeat(depth)}${']'.repeat(depth)}}`;

/** Every route that takes a sandbox id, with a body it accepts. */
const SANDBOX_ROUTES: { method: 'GET' | 'POST' | 'PUT' | 'DELETE'; path: string; body?: string }[] =
  [
    { method: 'GET', path: '' },
    { method: 'DELETE', path: '' },
    { method: 'GET', path: '/logs' },
    { method: 'POST', path: '/exec', body: '{"code":"print 1"}' },
    { method: 'POST', path: '/fork', body: '{"n":1}' },
    { method: 'POST', path: '/snapshot' },
    { method: 'POST', path: '/pause' },
    { method: 'POST', path: '/resume' },
    { method: 'GET', path: '/files?path=/tmp/x' },
    { method: 'GET', path: '/files/list?path=/tmp' },
    { method: 'GET', path: '/files/stat?path=/tmp' },
    { method: 'POST', path: '/files/mkdir?path=/tmp/d' },
    { method: 'DELETE', path: '/files?path=/tmp/x' },
  ];

describe('HTTP errors', () => {
  let s: TestServer;
  let sandbox: string;
  before(async () => {
    s = await startServer();
    sandbox = (await s.manager.create({})).id;
  });
  after(() => s.close());

  const send = (
    method: 'GET' | 'POST' | 'PUT' | 'DELETE',
    url: string,
    body?: string,
  ): ReturnType<TestServer['inject']> =>
    s.inject({
      method,
      url,
      ...(body === undefined
        ? {}
        : { payload: body, headers: { 'content-type': 'application/json' } }),
    });

  describe('a body nested 200,000 deep is a 400 on every route that takes a body', () => {
    const cases: [string, string, string][] = [
      ['create (template)', '/v1/sandboxes', nestedIn('template', 200_000)],
      ['create (snapshot)', '/v1/sandboxes', nestedIn('snapshot', 200_000)],
      ['create (env)', '/v1/sandboxes', nestedIn('env', 200_000)],
      ['create (network)', '/v1/sandboxes', `{"network":{"allow_out":${deep(200_000)}}}`],
      ['fork', '/fork', deep(200_000)],
      ['exec (code)', '/exec', nestedIn('code', 200_000)],
      ['exec (env)', '/exec', `{"code":"print 1","env":${deep(200_000)}}`],
      ['exec (cwd)', '/exec', `{"code":"print 1","cwd":${deep(200_000)}}`],
      ['snapshot', '/snapshot', deep(200_000)],
      ['pause', '/pause', deep(200_000)],
    ];
    for (const [name, route, body] of cases) {
      test(name, async () => {
        const url = route.startsWith('/v1/') ? route : `/v1/sandboxes/${sandbox}${route}`;
        const res = await send('POST', url, body);
        assert.equal(res.statusCode, 400, res.body.slice(0, 300));
        assert.equal(errorBody(res).code, 'invalid_request');
      });
    }
  });

  test('a rejected value nested as deep as the parser takes is quoted in a few characters', async () => {
    for (const body of [
      nestedIn('n', 60),
      nestedIn('template', 60),
      `{"network":{"allow_out":[${'['.repeat(60)}${']'.repeat(60)}]}}`,
      `{"network":{"allow_out":["${'x'.repeat(1_000_000)}"]}}`,
      `{"${'k'.repeat(1_000_000)}":1}`,
      `{"env":{"${'A'.repeat(1_000_000)}":1}}`,
    ]) {
      const url = body.startsWith('{"n"') ? `/v1/sandboxes/${sandbox}/fork` : '/v1/sandboxes';
      const res = await send('POST', url, body);
      assert.equal(res.statusCode, 400, res.body.slice(0, 300));
      assert.equal(errorBody(res).code, 'invalid_request');
      assert.ok(res.body.length < 400, `a short message: ${res.body.slice(0, 500)}`);
    }
  });

  test('a long or undecodable sandbox id is sandbox_not_found on every route, URL not echoed', async () => {
    for (const id of ['x'.repeat(201), 'sbx_'.repeat(3000), '%ff%fe', 'sbx_%ff', '%', '%e2%82']) {
      for (const r of SANDBOX_ROUTES) {
        const res = await send(r.method, `/v1/sandboxes/${id}${r.path}`, r.body);
        assert.equal(res.statusCode, 404, `${r.method} ${r.path}: ${res.body.slice(0, 300)}`);
        assert.equal(errorBody(res).code, 'sandbox_not_found');
        assert.ok(res.body.length < 300, `the id is not echoed whole: ${res.body.slice(0, 300)}`);
      }
    }
    const merge = await send('POST', `/v1/sandboxes/${'y'.repeat(5000)}/merge_into/%ff`);
    assert.equal(merge.statusCode, 404);
    assert.equal(errorBody(merge).code, 'sandbox_not_found');
  });

  test('other ids and names of any length or bytes are their not-found errors', async () => {
    for (const bad of ['z'.repeat(5000), '%ff%fe']) {
      const snap = await send('GET', `/v1/snapshots/${bad}`);
      assert.equal(snap.statusCode, 404);
      assert.equal(errorBody(snap).code, 'snapshot_not_found');
      const del = await send('DELETE', `/v1/snapshots/${bad}`);
      assert.equal(errorBody(del).code, 'snapshot_not_found');
      const tpl = await send('GET', `/v1/templates/${bad}`);
      assert.equal(tpl.statusCode, 404);
      assert.equal(errorBody(tpl).code, 'template_not_found');
      assert.ok(tpl.body.length < 300, tpl.body.slice(0, 300));
      const route = await send('GET', `/v1/${bad}/x`);
      assert.equal(route.statusCode, 404);
      assert.equal(errorBody(route).code, 'route_not_found');
      assert.ok(route.body.length < 300, route.body.slice(0, 300));
    }
  });

  test('an undecodable URL is authenticated like any other', async () => {
    const res = await s.app.inject({ method: 'GET', url: '/v1/sandboxes/%ff%fe' });
    assert.equal(res.statusCode, 401);
    assert.equal(errorBody(res).code, 'missing_api_key');
  });

  test('bad query strings are the route validation errors', async () => {
    for (const q of [
      'path=%ff',
      'path=%',
      'path=/tmp/%ff',
      'path=/a&path=/b',
      `path=${'%'.repeat(3000)}`,
    ]) {
      const res = await send('GET', `/v1/sandboxes/${sandbox}/files/stat?${q}`);
      assert.ok(res.statusCode >= 400 && res.statusCode < 500, `${q}: ${res.body.slice(0, 200)}`);
      errorBody(res);
    }
    const flag = await send('DELETE', `/v1/sandboxes/${sandbox}/files?path=/tmp/x&recursive=%ff`);
    assert.equal(flag.statusCode, 400);
    assert.equal(errorBody(flag).code, 'invalid_request');
  });

  describe("what Node's HTTP parser refuses (on a socket)", () => {
    let port: number;
    before(async () => {
      await s.app.listen({ host: '127.0.0.1', port: 0 });
      port = (s.app.server.address() as AddressInfo).port;
    });

    /** Writes `raw` on a new connection; the whole answer, once hostd closes it. */
    const raw = (bytes: string): Promise<string> =>
      new Promise((resolve, reject) => {
        const socket = tcpConnect(port, '127.0.0.1');
        let answer = '';
        socket.setEncoding('utf8');
        socket.on('data', (d: string) => (answer += d));
        socket.on('error', reject);
        socket.on('close', () => resolve(answer));
        socket.end(bytes);
      });

    const parse = (answer: string): { statusCode: number; body: string } => {
      const [head, body = ''] = answer.split('\r\n\r\n');
      return { statusCode: Number(/^HTTP\/1\.1 (\d{3})/.exec(head ?? '')?.[1]), body };
    };

    test('a URL longer than the headers limit is 431 headers_too_large', async () => {
      const res = parse(
        await raw(`GET /v1/sandboxes/${'x'.repeat(20_000)} HTTP/1.1\r\nHost: h\r\n\r\n`),
      );
      assert.equal(res.statusCode, 431);
      assert.equal(errorBody(res).code, 'headers_too_large');
    });

    test('headers over the limit are 431 headers_too_large', async () => {
      const res = parse(
        await raw(`GET /v1/healthz HTTP/1.1\r\nHost: h\r\nX-Big: ${'y'.repeat(20_000)}\r\n\r\n`),
      );
      assert.equal(res.statusCode, 431);
      assert.equal(errorBody(res).code, 'headers_too_large');
    });

    test('bytes that are not HTTP are 400 invalid_request', async () => {
      const res = parse(await raw('HELLO THERE\r\n\r\n'));
      assert.equal(res.statusCode, 400);
      assert.equal(errorBody(res).code, 'invalid_request');
    });

    test('a Content-Length that is not a number is 400 invalid_request', async () => {
      const res = parse(
        await raw('POST /v1/sandboxes HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n{}'),
      );
      assert.equal(res.statusCode, 400);
      assert.equal(errorBody(res).code, 'invalid_request');
    });
  });
});
