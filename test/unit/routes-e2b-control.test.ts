/**
 * Route tests of the E2B front's control plane (docs/e2b.md), its own fastify app on its own
 * port, over a manager on the fake hypervisor through `inject()`: `X-API-KEY` on every route,
 * E2B's error body `{code, message, error_code}` with the registry's code, the statuses E2B's
 * SDKs branch on (201 for a create, 204 for a kill, 501 for what hostd does not offer), and the
 * older endpoints E2B's Python SDK calls. That the published SDKs read these answers as their
 * error classes, and the data plane (envd, the interpreter) with real guests, are
 * test/integration/e2b-*.test.ts's.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { HTTPMethods } from 'fastify';
import { Errors } from '../../src/errors.js';
import { e2bErrorBody, startE2bServer, type TestE2bServer } from '../helpers/e2b-server.js';

/** The control plane's routes (src/api/e2b/control.ts), as fastify names them. */
const CONTROL_ROUTES = [
  'POST /v2/sandboxes',
  'POST /sandboxes',
  'GET /v2/sandboxes',
  'GET /sandboxes',
  'GET /sandboxes/:id',
  'DELETE /sandboxes/:id',
  'POST /sandboxes/:id/timeout',
  'POST /sandboxes/:id/refreshes',
  'POST /sandboxes/:id/pause',
  'POST /v2/sandboxes/:id/connect',
  'POST /sandboxes/:id/connect',
  'POST /sandboxes/:id/resume',
  'POST /sandboxes/:id/fork',
  'GET /sandboxes/:id/metrics',
  'GET /sandboxes/metrics',
  'POST /sandboxes/:id/snapshots',
  'GET /snapshots',
  'DELETE /templates/:id',
  'PUT /sandboxes/:id/network',
];

const UNKNOWN = `sbx_${'0'.repeat(32)}`;
const fill = (route: string, id: string): string => route.replace(':id', id);
const split = (route: string): [HTTPMethods, string] => route.split(' ') as [HTTPMethods, string];

describe('the E2B control plane', () => {
  let s: TestE2bServer;
  const reached = new Set<string>();
  before(async () => {
    s = await startE2bServer();
  });
  after(() => s.close());

  /** `s.inject`, keeping which control route each request named. */
  const send = async (method: HTTPMethods, url: string, payload?: unknown) => {
    const path = url.split('?')[0]!;
    for (const route of CONTROL_ROUTES) {
      const [m, pattern] = split(route);
      const re = new RegExp(`^${pattern.replace(':id', '[^/]+')}$`);
      // `/sandboxes/metrics` is its own route, not `/sandboxes/:id`.
      const exact = CONTROL_ROUTES.includes(`${method} ${path}`);
      if (m === method && re.test(path) && (!exact || pattern === path)) reached.add(route);
    }
    return s.inject({
      method,
      url,
      ...(payload === undefined ? {} : { payload: payload as object }),
    });
  };
  const json = <T>(res: { body: string }): T => JSON.parse(res.body) as T;
  const create = async (body: object = {}): Promise<string> => {
    const res = await send('POST', '/v2/sandboxes', { templateID: 'base', ...body });
    assert.equal(res.statusCode, 201, res.body);
    return json<{ sandboxID: string }>(res).sandboxID;
  };

  test('every control route exists on the app', async () => {
    await s.app.ready();
    for (const route of CONTROL_ROUTES) {
      const [method, url] = split(route);
      assert.ok(s.app.hasRoute({ method, url, constraints: { e2bPort: 'control' } }), route);
    }
  });

  test('without X-API-KEY, 401 missing_api_key; with a wrong one, 401 invalid_api_key', async () => {
    for (const route of CONTROL_ROUTES) {
      const [method, url] = split(fill(route, UNKNOWN));
      const bare = await s.app.inject({ method, url });
      assert.equal(bare.statusCode, 401, route);
      assert.deepEqual(e2bErrorBody(bare), {
        code: 401,
        message: Errors.missingE2bApiKey.message(),
        error_code: Errors.missingE2bApiKey.code,
      });
      const wrong = await s.app.inject({ method, url, headers: { 'x-api-key': 'e2b_wrong' } });
      assert.equal(wrong.statusCode, 401, route);
      assert.equal(e2bErrorBody(wrong).error_code, Errors.invalidApiKey.code, route);
    }
  });

  test('an unknown sandbox is 404 sandbox_not_found on every route that names one', async () => {
    for (const route of CONTROL_ROUTES.filter((r) => r.includes(':id/') || r.endsWith(':id'))) {
      if (route.startsWith('DELETE /templates') || route.startsWith('PUT')) continue;
      const [method, url] = split(fill(route, UNKNOWN));
      const body = route.endsWith('/timeout') ? { timeout: 60 } : undefined;
      const res = await send(method, url, body);
      assert.equal(res.statusCode, 404, `${route}: ${res.body}`);
      assert.equal(e2bErrorBody(res).error_code, Errors.sandboxNotFound.code, route);
    }
  });

  test('create: 201 with the id, template and envd access token; the older /sandboxes answers alike', async () => {
    const v2 = await send('POST', '/v2/sandboxes', { templateID: 'base', metadata: { k: 'v2' } });
    assert.equal(v2.statusCode, 201, v2.body);
    assert.equal(v2.headers['content-type'], 'application/json; charset=utf-8');
    const tag = 'legacy';
    const legacy = await send('POST', '/sandboxes', {
      templateID: 'base',
      timeout: 120,
      metadata: { tag },
    });
    assert.equal(legacy.statusCode, 201, legacy.body);
    const answer = json<Record<string, unknown>>(legacy);
    assert.deepEqual(Object.keys(answer).sort(), Object.keys(json<object>(v2)).sort());
    const id = String(answer.sandboxID);
    assert.match(id, /^sbx_[0-9a-f]{32}$/);
    assert.equal(answer.templateID, 'base');
    assert.equal(answer.alias, 'base');
    assert.equal(typeof answer.envdAccessToken, 'string');
    assert.match(String(answer.envdVersion), /^\d+\.\d+\.\d+$/);

    const listed = await send('GET', `/sandboxes?metadata=${encodeURIComponent(`tag=${tag}`)}`);
    assert.equal(listed.statusCode, 200);
    assert.deepEqual(
      json<{ sandboxID: string }[]>(listed).map((x) => x.sandboxID),
      [id],
    );
    const v2list = await send('GET', '/v2/sandboxes?state=running');
    assert.equal(v2list.statusCode, 200);
    assert.ok(json<{ sandboxID: string }[]>(v2list).some((x) => x.sandboxID === id));

    const again = await send('POST', `/sandboxes/${id}/connect`, { timeout: 60 });
    assert.equal(again.statusCode, 200, 'a running sandbox is connected, not resumed');
    assert.equal(json<Record<string, unknown>>(again).sandboxID, id);
    assert.equal(
      json<Record<string, unknown>>(again).envdAccessToken,
      answer.envdAccessToken,
      "a sandbox's access token stays the same",
    );
  });

  test('bad values are 400 with the status as code; what hostd does not offer is 501', async () => {
    for (const body of [{ templateID: 7 }, { templateID: 'base', timeout: 31 * 24 * 3600 }]) {
      const res = await send('POST', '/v2/sandboxes', body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(e2bErrorBody(res).error_code, Errors.invalidField.code);
    }
    const deny = await send('POST', '/v2/sandboxes', {
      templateID: 'base',
      network: { denyOut: ['10.1.2.3'] },
    });
    assert.equal(deny.statusCode, 501);
    assert.equal(e2bErrorBody(deny).error_code, Errors.notSupported.code);
    for (const path of ['/templates', '/volumes', '/secrets', '/teams']) {
      const res = await s.inject({ method: 'GET', url: path });
      assert.equal(res.statusCode, 501, path);
      assert.equal(e2bErrorBody(res).error_code, Errors.notSupported.code, path);
    }
    const unknown = await send('GET', `/sandboxes/${UNKNOWN}`);
    assert.deepEqual(Object.keys(json<object>(unknown)).sort(), ['code', 'error_code', 'message']);
  });

  test('timeout and refreshes are 204; pause is 204, then 409; connect resumes with 201', async () => {
    const id = await create();
    assert.equal(
      (await send('POST', `/sandboxes/${id}/timeout`, { timeout: 600 })).statusCode,
      204,
    );
    const noTimeout = await send('POST', `/sandboxes/${id}/timeout`, {});
    assert.equal(noTimeout.statusCode, 400);
    assert.equal(e2bErrorBody(noTimeout).error_code, Errors.invalidField.code);
    assert.equal(
      (await send('POST', `/sandboxes/${id}/refreshes`, { duration: 60 })).statusCode,
      204,
    );
    assert.equal((await send('POST', `/sandboxes/${id}/pause`)).statusCode, 204);
    const twice = await send('POST', `/sandboxes/${id}/pause`);
    assert.equal(twice.statusCode, 409);
    assert.equal(e2bErrorBody(twice).error_code, Errors.sandboxAlreadyPaused.code);
    const resumed = await send('POST', `/v2/sandboxes/${id}/connect`, { timeout: 60 });
    assert.equal(resumed.statusCode, 201, resumed.body);
    const legacy = await send('POST', `/sandboxes/${id}/resume`, {});
    assert.equal(legacy.statusCode, 201, 'the older resume is always 201');
  });

  test('fork is 201 with its children; a bad count is 400', async () => {
    const id = await create();
    const res = await send('POST', `/sandboxes/${id}/fork`, { count: 2 });
    assert.equal(res.statusCode, 201, res.body);
    assert.equal(json<unknown[]>(res).length, 2);
    for (const count of [0, 33, 1.5, '2']) {
      const bad = await send('POST', `/sandboxes/${id}/fork`, { count });
      assert.equal(bad.statusCode, 400, String(count));
      assert.equal(e2bErrorBody(bad).error_code, Errors.invalidField.code);
    }
  });

  test('metrics: per sandbox, a window in unix seconds; the latest of several', async () => {
    const id = await create();
    const one = await send('GET', `/sandboxes/${id}/metrics`);
    assert.equal(one.statusCode, 200, one.body);
    assert.ok(Array.isArray(json<unknown>(one)));
    const bad = await send('GET', `/sandboxes/${id}/metrics?start=yesterday`);
    assert.equal(bad.statusCode, 400);
    assert.equal(e2bErrorBody(bad).error_code, Errors.invalidField.code);
    const many = await send('GET', `/sandboxes/metrics?sandbox_ids=${id}`);
    assert.equal(many.statusCode, 200, many.body);
    assert.ok(typeof json<{ sandboxes: object }>(many).sandboxes === 'object');
  });

  test('snapshots: 201, listed, deleted through /templates/{id} with 204; templates are not', async () => {
    const id = await create();
    const snap = await send('POST', `/sandboxes/${id}/snapshots`, { name: 'e2b-snap' });
    assert.equal(snap.statusCode, 201, snap.body);
    const snapshotID = json<{ snapshotID: string }>(snap).snapshotID;
    const list = await send('GET', `/snapshots?sandboxID=${id}`);
    assert.equal(list.statusCode, 200);
    assert.deepEqual(
      json<{ snapshotID: string }[]>(list).map((x) => x.snapshotID),
      [snapshotID],
    );
    const badName = await send('POST', `/sandboxes/${id}/snapshots`, { name: '' });
    assert.equal(badName.statusCode, 400);
    assert.equal((await send('DELETE', `/templates/${snapshotID}`)).statusCode, 204);
    const gone = await send('DELETE', `/templates/${snapshotID}`);
    assert.equal(gone.statusCode, 404);
    assert.equal(e2bErrorBody(gone).error_code, Errors.snapshotNotFound.code);
    const template = await send('DELETE', '/templates/python');
    assert.equal(template.statusCode, 501);
    assert.equal(e2bErrorBody(template).error_code, Errors.notSupported.code);
  });

  test('updateNetwork is 501; kill is 204, then 404', async () => {
    const id = await create();
    const net = await send('PUT', `/sandboxes/${id}/network`, { allowOut: ['1.1.1.1'] });
    assert.equal(net.statusCode, 501);
    assert.equal(e2bErrorBody(net).error_code, Errors.notSupported.code);
    const kill = await send('DELETE', `/sandboxes/${id}`);
    assert.equal(kill.statusCode, 204);
    assert.equal(kill.body, '');
    const again = await send('GET', `/sandboxes/${id}`);
    assert.equal(again.statusCode, 404);
    assert.equal(e2bErrorBody(again).error_code, Errors.sandboxNotFound.code);
  });

  test('every control route was exercised with the key', () => {
    assert.deepEqual(
      CONTROL_ROUTES.filter((r) => !reached.has(r)),
      [],
    );
  });
});
