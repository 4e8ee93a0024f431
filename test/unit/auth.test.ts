import { test } from 'node:test';
import assert from 'node:assert/strict';
import { authMode, makeAuthChecker } from '../../src/api/auth.js';

test('loopback with no keys means no auth', () => {
  assert.deepEqual(authMode({ apiKeys: [], authDisabled: false, loopback: true }), {
    kind: 'open',
    why: 'loopback-no-keys',
  });
});

test('a non-loopback bind with no keys and no disable flag refuses to start', () => {
  assert.throws(
    () => authMode({ apiKeys: [], authDisabled: false, loopback: false }),
    /refusing to start/,
  );
});

test('SERVICE_AUTH_DISABLED=1 wins over keys and binds', () => {
  assert.equal(authMode({ apiKeys: ['k'], authDisabled: true, loopback: false }).kind, 'open');
});

test('configured keys are required even on loopback', () => {
  const check = makeAuthChecker(
    authMode({ apiKeys: ['k1', 'k2'], authDisabled: false, loopback: true }),
  );
  assert.equal(check('Bearer k1'), null);
  assert.equal(check('Bearer k2'), null);
  // The contract fixes the two messages; clients branch on the codes.
  assert.equal(check(undefined)?.code, 'missing_api_key');
  assert.equal(check(undefined)?.message, 'missing Authorization: Bearer <key>');
  assert.equal(check('Basic abc')?.code, 'missing_api_key');
  assert.equal(check('Bearer nope')?.code, 'invalid_api_key');
  assert.equal(check('Bearer nope')?.message, 'invalid api key');
  assert.equal(check('Bearer k1x')?.status, 401);
});
