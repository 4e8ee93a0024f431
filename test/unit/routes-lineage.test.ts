/**
 * Route tests of fork and merge (docs/api.md, Fork and merge): validation, ids, the answers'
 * shapes. On the fake hypervisor through `inject()`: that children carry the parent's running
 * state, and what merge does to VMs, are the integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { run } from '../helpers/manager.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

const UNKNOWN = `sbx_${'f'.repeat(32)}`;

describe('fork and merge routes', () => {
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
  const value = async (id: string, key: string): Promise<unknown> =>
    (await run(s.manager, id, `get ${key}`)).find((e) => e.type === 'stdout')?.data;

  test('POST /v1/sandboxes/{id}/fork answers the parent and n ready children', async () => {
    const parent = (await s.manager.create({})).id;
    const res = await post(`/v1/sandboxes/${parent}/fork`, { n: 2 });
    assert.equal(res.statusCode, 200, res.body);
    assert.equal(res.headers['content-type'], 'application/json; charset=utf-8');
    const body = JSON.parse(res.body) as {
      parent_id: string;
      children: { id: string; state: string }[];
    };
    assert.equal(body.parent_id, parent);
    assert.equal(body.children.length, 2);
    for (const c of body.children) {
      assert.match(c.id, /^sbx_[0-9a-f]{32}$/);
      assert.equal(c.state, 'ready');
    }
    for (const c of body.children) await s.manager.delete(c.id);
  });

  test('n outside 1..32, or not an integer, is a 400 and the parent is untouched', async () => {
    const parent = (await s.manager.create({})).id;
    await run(s.manager, parent, 'set v 7');
    const before = s.manager.count;
    for (const body of [
      { n: 0 },
      { n: 33 },
      { n: '2' },
      { n: 1.5 },
      {},
      undefined,
      { n: 1, x: 1 },
    ]) {
      const res = await post(`/v1/sandboxes/${parent}/fork`, body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
    }
    assert.equal(s.manager.count, before);
    assert.equal(await value(parent, 'v'), '7');
  });

  test('forking an unknown sandbox is 404 sandbox_not_found', async () => {
    const res = await post(`/v1/sandboxes/${UNKNOWN}/fork`, { n: 1 });
    assert.equal(res.statusCode, 404);
    assert.equal(errorBody(res).code, Errors.sandboxNotFound.code);
  });

  test('a fork over the sandbox cap is 429 limit_reached with Retry-After, and starts nothing', async () => {
    const parent = (await s.manager.create({})).id;
    const before = s.manager.count;
    const res = await post(`/v1/sandboxes/${parent}/fork`, { n: 32 });
    assert.equal(res.statusCode, 429);
    assert.equal(errorBody(res).code, Errors.sandboxLimit.code);
    assert.equal(res.headers['retry-after'], String(Errors.sandboxLimit.retryAfterS));
    assert.equal(s.manager.count, before);
  });

  describe('POST /v1/sandboxes/{parent}/merge_into/{winner}', () => {
    test('merging into itself is 400; unknown ids are 404; a body is 400', async () => {
      const parent = (await s.manager.create({})).id;
      const self = await post(`/v1/sandboxes/${parent}/merge_into/${parent}`);
      assert.equal(self.statusCode, 400);
      assert.equal(errorBody(self).code, Errors.mergeIntoSelf.code);
      for (const path of [`${parent}/merge_into/${UNKNOWN}`, `${UNKNOWN}/merge_into/${parent}`]) {
        const r = await post(`/v1/sandboxes/${path}`);
        assert.equal(r.statusCode, 404, path);
        assert.equal(errorBody(r).code, Errors.sandboxNotFound.code, path);
      }
      const [child] = await s.manager.fork(parent, 1);
      await run(s.manager, child!.id, 'set w 2');
      const withBody = await post(`/v1/sandboxes/${parent}/merge_into/${child!.id}`, { x: 1 });
      assert.equal(withBody.statusCode, 400);
      assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
      assert.equal(await value(child!.id, 'w'), '2');
    });

    test("answers the parent's id, ready, and the winner merged", async () => {
      const parent = (await s.manager.create({})).id;
      const [child] = await s.manager.fork(parent, 1);
      await run(s.manager, child!.id, 'set won yes');
      const res = await post(`/v1/sandboxes/${parent}/merge_into/${child!.id}`);
      assert.equal(res.statusCode, 200, res.body);
      assert.deepEqual(JSON.parse(res.body), { id: parent, state: 'ready', merged: child!.id });
      assert.equal(await value(parent, 'won'), 'yes');
    });
  });

  test('every route of this area was exercised', () => assertAreaCovered('lineage'));
});
