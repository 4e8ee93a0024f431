/**
 * Route tests of the cluster routes on a single hostd (docs/api.md, Cluster): the cluster is
 * reported off, and a drain, an undrain and the node-to-node routes of a hand-over are `409 not_clustered`. In cluster mode they are
 * cluster-front.test.ts's and the cluster integration tests'.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Errors } from '../../src/errors.js';
import { assertAreaCovered } from '../helpers/routes.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

describe('cluster routes on a single hostd', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer();
  });
  after(() => s.close());

  test('GET /v1/cluster says the cluster is off', async () => {
    const res = await s.inject({ method: 'GET', url: '/v1/cluster' });
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['content-type'], 'application/json; charset=utf-8');
    assert.deepEqual(JSON.parse(res.body), { enabled: false, node: null, etcd: null, nodes: [] });
  });

  test('POST /v1/cluster/nodes/{id}/drain is 409 not_clustered; a body is 400 first', async () => {
    const res = await s.inject({ method: 'POST', url: '/v1/cluster/nodes/node-1/drain' });
    assert.equal(res.statusCode, 409);
    assert.equal(errorBody(res).code, Errors.notClustered.code);
    const withBody = await s.inject({
      method: 'POST',
      url: '/v1/cluster/nodes/node-1/drain',
      payload: {},
    });
    assert.equal(withBody.statusCode, 400);
    assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
  });

  test('POST /v1/cluster/nodes/{id}/undrain is 409 not_clustered; a body is 400 first', async () => {
    const res = await s.inject({ method: 'POST', url: '/v1/cluster/nodes/node-1/undrain' });
    assert.equal(res.statusCode, 409);
    assert.equal(errorBody(res).code, Errors.notClustered.code);
    const withBody = await s.inject({
      method: 'POST',
      url: '/v1/cluster/nodes/node-1/undrain',
      payload: {},
    });
    assert.equal(withBody.statusCode, 400);
    assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
  });

  test('DELETE /v1/cluster/nodes/{id} (forget a node) is 409 not_clustered; a body is 400 first', async () => {
    const res = await s.inject({ method: 'DELETE', url: '/v1/cluster/nodes/node-1' });
    assert.equal(res.statusCode, 409);
    assert.equal(errorBody(res).code, Errors.notClustered.code);
    const withBody = await s.inject({
      method: 'DELETE',
      url: '/v1/cluster/nodes/node-1',
      payload: { x: 1 },
    });
    assert.equal(withBody.statusCode, 400);
    assert.equal(errorBody(withBody).code, Errors.bodyNotAllowed.code);
  });

  test('the node-to-node routes of a hand-over and a copy are 409 not_clustered, whatever cluster key is sent', async () => {
    for (const headers of [{}, { 'x-hostd-cluster-key': 'anything' }]) {
      const file = await s.inject({ method: 'GET', url: '/v1/cluster/peer/files?path=x', headers });
      assert.equal(file.statusCode, 409);
      assert.equal(errorBody(file).code, Errors.notClustered.code);
      const offer = await s.inject({
        method: 'POST',
        url: '/v1/cluster/peer/sandboxes/sbx_1/hand-over',
        headers,
        payload: {},
      });
      assert.equal(offer.statusCode, 409);
      assert.equal(errorBody(offer).code, Errors.notClustered.code);
      const snapshot = await s.inject({
        method: 'POST',
        url: '/v1/cluster/peer/snapshots/snap_1/hand-over',
        headers,
        payload: {},
      });
      assert.equal(snapshot.statusCode, 409);
      assert.equal(errorBody(snapshot).code, Errors.notClustered.code);
      const exported = await s.inject({
        method: 'GET',
        url: '/v1/cluster/peer/snapshots/snap_1/export',
        headers,
      });
      assert.equal(exported.statusCode, 409);
      assert.equal(errorBody(exported).code, Errors.notClustered.code);
    }
  });

  test('every route of this area was exercised', () => assertAreaCovered('cluster'));
});
