/**
 * Route tests of REPL contexts (docs/api.md, Contexts): create, list, delete and restart, their
 * validation and their 404/409/400 answers. On the fake hypervisor, which keeps contexts in its
 * memory (test/helpers/fake-hypervisor.ts), through `inject()`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('context routes', () => {
  let s: TestServer;
  let id: string;
  before(async () => {
    s = await startServer();
    id = (await s.manager.create({})).id;
  });
  after(() => s.close());

  const send = (method: 'GET' | 'POST' | 'DELETE', path: string, payload?: unknown) =>
    s.inject({
      method,
      url: `/v1/sandboxes/${id}/contexts${path}`,
      ...(payload === undefined ? {} : { payload: payload as object }),
    });

  test('POST creates one, under its id or a new one; GET lists them with the default', async () => {
    const named = await send('POST', '', { id: 'c1', cwd: '/tmp' });
    assert.equal(named.statusCode, 200, named.body);
    assert.equal(named.headers['content-type'], 'application/json; charset=utf-8');
    assert.deepEqual(JSON.parse(named.body), { id: 'c1', cwd: '/tmp', execution_count: 0 });
    const fresh = await send('POST', '');
    assert.equal(fresh.statusCode, 200, fresh.body);
    const list = await send('GET', '');
    assert.equal(list.statusCode, 200);
    const ids = (JSON.parse(list.body) as { contexts: { id: string }[] }).contexts.map((c) => c.id);
    assert.ok(
      ['default', 'c1', (JSON.parse(fresh.body) as { id: string }).id].every((c) =>
        ids.includes(c),
      ),
      ids.join(),
    );
  });

  test('bad bodies are 400 invalid_request', async () => {
    for (const body of [{ id: '-x' }, { id: 'a/b' }, { cwd: 'tmp' }, { name: 'c' }, []]) {
      const res = await send('POST', '', body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
    }
  });

  test('an id the sandbox has is 409 context_exists', async () => {
    await send('POST', '', { id: 'twice' });
    const res = await send('POST', '', { id: 'twice' });
    assert.equal(res.statusCode, 409);
    assert.equal(errorBody(res).code, Errors.contextExists.code);
  });

  test('restart answers the context afresh; delete is 204 then 404; bodies are 400', async () => {
    await send('POST', '', { id: 'r1' });
    for (const [method, path] of [
      ['POST', '/r1/restart'],
      ['DELETE', '/r1'],
    ] as const) {
      const res = await send(method, path, {});
      assert.equal(res.statusCode, 400, path);
      assert.equal(errorBody(res).code, Errors.bodyNotAllowed.code);
    }
    const restarted = await send('POST', '/r1/restart');
    assert.equal(restarted.statusCode, 200, restarted.body);
    assert.equal((JSON.parse(restarted.body) as { id: string }).id, 'r1');
    const del = await send('DELETE', '/r1');
    assert.equal(del.statusCode, 204);
    assert.equal(del.body, '');
    for (const [method, path] of [
      ['DELETE', '/r1'],
      ['POST', '/r1/restart'],
    ] as const) {
      const res = await send(method, path);
      assert.equal(res.statusCode, 404, path);
      assert.equal(errorBody(res).code, Errors.contextNotFound.code);
    }
  });

  test('a context id that cannot exist is context_not_found', async () => {
    for (const bad of ['-x', '%ff', 'a'.repeat(65)]) {
      const res = await send('DELETE', `/${bad}`);
      assert.equal(res.statusCode, 404, bad);
      assert.equal(errorBody(res).code, Errors.contextNotFound.code);
    }
  });

  test('the default context is restarted, never deleted: 400 context_is_default', async () => {
    const res = await send('DELETE', '/default');
    assert.equal(res.statusCode, 400);
    assert.equal(errorBody(res).code, Errors.contextIsDefault.code);
    assert.equal((await send('POST', '/default/restart')).statusCode, 200);
  });

  test('every route of this area was exercised', () => assertAreaCovered('contexts'));
});
