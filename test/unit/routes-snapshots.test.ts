/**
 * Route tests of snapshots (docs/api.md, Snapshots): taking one, with or without a name, listing,
 * describing and deleting, validation and not-found answers. On the fake hypervisor through
 * `inject()`; that a sandbox made from a snapshot has its state is the integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

const JSON_TYPE = 'application/json; charset=utf-8';

describe('snapshot routes', () => {
  let s: TestServer;
  let id: string;
  before(async () => {
    s = await startServer();
    id = (await s.manager.create({})).id;
  });
  after(() => s.close());

  const snapshot = (payload?: unknown) =>
    s.inject({
      method: 'POST',
      url: `/v1/sandboxes/${id}/snapshot`,
      ...(payload === undefined ? {} : { payload: payload as object }),
    });

  test('POST /v1/sandboxes/{id}/snapshot takes one, named or not', async () => {
    for (const body of [undefined, {}, { name: 'before step 3' }]) {
      const res = await snapshot(body);
      assert.equal(res.statusCode, 200, res.body);
      assert.equal(res.headers['content-type'], JSON_TYPE);
      const snap = JSON.parse(res.body) as {
        snapshot_id: string;
        name: string | null;
        source_sandbox_id: string;
      };
      assert.match(snap.snapshot_id, /^snap_[0-9a-f]{32}$/);
      assert.equal(snap.source_sandbox_id, id);
      assert.equal(snap.name, body?.name ?? null);
    }
  });

  test('a bad name or an unknown field is 400 invalid_request', async () => {
    for (const body of [
      { name: '' },
      { name: ' lead' },
      { name: 'x'.repeat(129) },
      { name: 1 },
      { tag: 'x' },
    ]) {
      const res = await snapshot(body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(errorBody(res).code, Errors.invalidField.code, JSON.stringify(body));
    }
  });

  test('GET lists them newest first; GET one describes it; DELETE is 204, then 404', async () => {
    const taken = JSON.parse((await snapshot({ name: 'listed' })).body) as { snapshot_id: string };
    const list = await s.inject({ method: 'GET', url: '/v1/snapshots' });
    assert.equal(list.statusCode, 200);
    assert.equal(list.headers['content-type'], JSON_TYPE);
    const { snapshots } = JSON.parse(list.body) as {
      snapshots: { snapshot_id: string; created_at: string }[];
    };
    assert.ok(snapshots.some((x) => x.snapshot_id === taken.snapshot_id));
    const times = snapshots.map((x) => x.created_at);
    assert.deepEqual(times, [...times].sort().reverse());

    const one = await s.inject({ method: 'GET', url: `/v1/snapshots/${taken.snapshot_id}` });
    assert.equal(one.statusCode, 200);
    assert.equal((JSON.parse(one.body) as { snapshot_id: string }).snapshot_id, taken.snapshot_id);

    const withBody = await s.inject({
      method: 'DELETE',
      url: `/v1/snapshots/${taken.snapshot_id}`,
      payload: {},
    });
    assert.equal(withBody.statusCode, 400);
    assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
    const del = await s.inject({ method: 'DELETE', url: `/v1/snapshots/${taken.snapshot_id}` });
    assert.equal(del.statusCode, 204);
    assert.equal(del.body, '');
    for (const method of ['GET', 'DELETE'] as const) {
      const gone = await s.inject({ method, url: `/v1/snapshots/${taken.snapshot_id}` });
      assert.equal(gone.statusCode, 404);
      assert.equal(errorBody(gone).code, Errors.snapshotNotFound.code);
    }
  });

  test('a sandbox is created from a snapshot by id', async () => {
    const taken = JSON.parse((await snapshot()).body) as { snapshot_id: string };
    const res = await s.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      payload: { snapshot: taken.snapshot_id },
    });
    assert.equal(res.statusCode, 200, res.body);
  });

  test('every route of this area was exercised', () => assertAreaCovered('snapshots'));
});
