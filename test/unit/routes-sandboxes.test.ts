/**
 * Route tests of the sandbox routes (docs/api.md, Sandboxes, Metadata and lifetime, Pause and
 * resume, Network): each body's validation as `400 invalid_request`, the conventions on bodies
 * (JSON only, unknown fields refused, an empty body is none), success statuses and content
 * types. On the fake hypervisor through `inject()`: what a sandbox does is the integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { plan } from '../helpers/fake-images.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

const JSON_TYPE = 'application/json; charset=utf-8';

describe('sandbox routes', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer();
  });
  after(() => s.close());

  const post = (url: string, payload?: unknown) =>
    s.inject({
      method: 'POST',
      url,
      ...(payload === undefined ? {} : { payload: payload as object }),
    });
  const create = async (body: unknown = {}): Promise<string> => {
    const res = await post('/v1/sandboxes', body);
    assert.equal(res.statusCode, 200, res.body);
    return (JSON.parse(res.body) as { id: string }).id;
  };

  describe('POST /v1/sandboxes', () => {
    test('{}, no body at all and a named template each give a ready sbx_ + 32 hex id', async () => {
      for (const body of [{}, undefined, { template: 'slim' }]) {
        const res = await post('/v1/sandboxes', body);
        assert.equal(res.statusCode, 200, res.body);
        assert.equal(res.headers['content-type'], JSON_TYPE);
        const created = JSON.parse(res.body) as { id: string; state: string };
        assert.deepEqual(Object.keys(created).sort(), ['id', 'state']);
        assert.match(created.id, /^sbx_[0-9a-f]{32}$/);
        assert.equal(created.state, 'ready');
      }
    });

    test('bad bodies are 400 invalid_request and create nothing', async () => {
      const before = s.manager.count;
      for (const body of [
        [],
        [{ template: 'python' }],
        { template: 1 },
        { template: 'python', snapshot: `snap_${'0'.repeat(32)}` },
        { timeout_ms: 5 },
        { env: { 'BAD-NAME': 'x' } },
        { env: { A: 1 } },
        { metadata: 'x' },
        { timeout: -1 },
        { timeout: 60, on_timeout: 'explode' },
        { on_timeout: 'pause' },
      ]) {
        const res = await post('/v1/sandboxes', body);
        assert.equal(res.statusCode, 400, JSON.stringify(body));
        assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
      }
      assert.equal(s.manager.count, before);
    });

    test('bad network rules are 400 invalid_request and create nothing', async () => {
      const before = s.manager.count;
      for (const rules of [['bad rule'], ['host.hostd.internal'], ['10.0.0.0/33'], 'example.com']) {
        const res = await post('/v1/sandboxes', { network: { allow_out: rules } });
        assert.equal(res.statusCode, 400, String(rules));
        assert.equal(errorBody(res).code, Errors.invalidEgressRule.code, String(rules));
      }
      const extra = await post('/v1/sandboxes', { network: { allow_out: [], deny: [] } });
      assert.equal(errorBody(extra).code, Errors.unknownField.code);
      assert.equal(s.manager.count, before);
    });

    test('an unknown template or snapshot is its 404', async () => {
      const tpl = await post('/v1/sandboxes', { template: 'ruby' });
      assert.equal(tpl.statusCode, 404);
      assert.equal(errorBody(tpl).code, Errors.templateNotFound.code);
      const snap = await post('/v1/sandboxes', { snapshot: `snap_${'0'.repeat(32)}` });
      assert.equal(snap.statusCode, 404);
      assert.equal(errorBody(snap).code, Errors.snapshotNotFound.code);
    });

    test('malformed JSON is 400, another content type 415, both with the error body', async () => {
      const bad = await s.inject({
        method: 'POST',
        url: '/v1/sandboxes',
        payload: '{"template":',
        headers: { 'content-type': 'application/json' },
      });
      assert.equal(bad.statusCode, 400);
      assert.equal(errorBody(bad).code, Errors.malformedRequest.code);
      const form = await s.inject({
        method: 'POST',
        url: '/v1/sandboxes',
        payload: 'template=python',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      });
      assert.equal(form.statusCode, 415);
      assert.equal(errorBody(form).code, Errors.unsupportedMediaType.code);
    });

    test('a body over SERVICE_MAX_BODY_BYTES is 413 body_too_large', async () => {
      const res = await post('/v1/sandboxes', { metadata: { big: 'x'.repeat(5 * 1024 * 1024) } });
      assert.equal(res.statusCode, 413);
      assert.equal(errorBody(res).code, Errors.bodyTooLarge.code);
    });

    test('at the sandbox cap, 429 limit_reached with Retry-After', async () => {
      const capped = await startServer({ maxSandboxes: 1 });
      try {
        assert.equal(
          (await capped.inject({ method: 'POST', url: '/v1/sandboxes' })).statusCode,
          200,
        );
        const res = await capped.inject({ method: 'POST', url: '/v1/sandboxes' });
        assert.equal(res.statusCode, 429);
        assert.equal(errorBody(res).code, Errors.sandboxLimit.code);
        assert.equal(res.headers['retry-after'], String(Errors.sandboxLimit.retryAfterS));
      } finally {
        await capped.close();
      }
    });

    test('on a host short of memory, 503 insufficient_resources with Retry-After', async () => {
      const short = await startServer({
        templates: [plan('python', { memoryMib: 512, vcpus: 1, poolSize: 0 })],
        hostFree: () => ({ memAvailableMib: 64, dataDirFreeMib: 1e6 }),
      });
      try {
        const res = await short.inject({ method: 'POST', url: '/v1/sandboxes' });
        assert.equal(res.statusCode, 503);
        assert.equal(errorBody(res).code, Errors.insufficientResources.code);
        assert.equal(res.headers['retry-after'], String(Errors.insufficientResources.retryAfterS));
      } finally {
        await short.close();
      }
    });
  });

  test('GET /v1/sandboxes lists it, GET /v1/sandboxes/{id} describes it', async () => {
    const id = await create({ metadata: { run: '7' } });
    const all = await s.inject({ method: 'GET', url: '/v1/sandboxes' });
    assert.equal(all.statusCode, 200);
    assert.equal(all.headers['content-type'], JSON_TYPE);
    const { sandboxes } = JSON.parse(all.body) as { sandboxes: { id: string }[] };
    assert.ok(sandboxes.some((x) => x.id === id));
    const one = await s.inject({ method: 'GET', url: `/v1/sandboxes/${id}` });
    assert.equal(one.statusCode, 200);
    const info = JSON.parse(one.body) as Record<string, unknown>;
    assert.equal(info.id, id);
    assert.equal(info.state, 'ready');
    assert.deepEqual(info.metadata, { run: '7' });
  });

  test('GET /v1/sandboxes/{id}/logs is plain text', async () => {
    const id = await create();
    const res = await s.inject({ method: 'GET', url: `/v1/sandboxes/${id}/logs` });
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['content-type'], 'text/plain; charset=utf-8');
  });

  test('DELETE /v1/sandboxes/{id} is 204 with no body, then 404; a body is 400', async () => {
    const id = await create();
    const withBody = await s.inject({ method: 'DELETE', url: `/v1/sandboxes/${id}`, payload: {} });
    assert.equal(withBody.statusCode, 400);
    assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
    const del = await s.inject({ method: 'DELETE', url: `/v1/sandboxes/${id}` });
    assert.equal(del.statusCode, 204);
    assert.equal(del.body, '');
    for (const method of ['GET', 'DELETE'] as const) {
      const gone = await s.inject({ method, url: `/v1/sandboxes/${id}` });
      assert.equal(gone.statusCode, 404);
      assert.equal(errorBody(gone).code, Errors.sandboxNotFound.code);
    }
  });

  test('POST /v1/sandboxes/{id}/timeout sets or clears the lifetime; bad bodies are 400', async () => {
    const id = await create();
    for (const body of [undefined, {}, { timeout: 0 }, { timeout: '60' }, { timeout: 60, x: 1 }]) {
      const res = await post(`/v1/sandboxes/${id}/timeout`, body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
    }
    const set = await post(`/v1/sandboxes/${id}/timeout`, { timeout: 60, on_timeout: 'pause' });
    assert.equal(set.statusCode, 200, set.body);
    assert.equal(set.headers['content-type'], JSON_TYPE);
    const cleared = await post(`/v1/sandboxes/${id}/timeout`, { timeout: null });
    assert.equal(cleared.statusCode, 200, cleared.body);
  });

  test('pause and resume answer {id, state}; a body is 400', async () => {
    const id = await create();
    for (const op of ['pause', 'resume']) {
      const res = await post(`/v1/sandboxes/${id}/${op}`, {});
      assert.equal(res.statusCode, 400, op);
      assert.equal(errorBody(res).code, Errors.bodyNotAllowed.code);
    }
    const paused = await post(`/v1/sandboxes/${id}/pause`);
    assert.equal(paused.statusCode, 200, paused.body);
    assert.deepEqual(JSON.parse(paused.body), { id, state: 'paused' });
    const resumed = await post(`/v1/sandboxes/${id}/resume`);
    assert.equal(resumed.statusCode, 200, resumed.body);
    assert.deepEqual(JSON.parse(resumed.body), { id, state: 'ready' });
  });

  test('every route of this area was exercised', () => assertAreaCovered('sandboxes'));
});
