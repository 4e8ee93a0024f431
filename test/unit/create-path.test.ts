/**
 * What a pool hit's create does not pay inside its request (docs/architecture.md, "A pool hit's
 * create, session 11"): the body check's compilation happens when the routes are registered.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isCompiled } from '../../src/api/wire/check.js';
import { CreateRequest } from '../../src/api/wire/index.js';
import { startServer } from '../helpers/server.js';

test("the create's body check is compiled when the routes are registered, before any create", async () => {
  assert.equal(isCompiled(CreateRequest), false, 'nothing compiled it in this process yet');
  const s = await startServer();
  try {
    assert.equal(isCompiled(CreateRequest), true);
    const res = await s.inject({ method: 'POST', url: '/v1/sandboxes', payload: {} });
    assert.equal(res.statusCode, 200);
  } finally {
    await s.close();
  }
});
