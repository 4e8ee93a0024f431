import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  authMode,
  makeAuthChecker,
  INVALID_KEY_MESSAGE,
  MISSING_KEY_MESSAGE,
} from '../../src/api/auth.js';

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
  assert.equal(check(undefined)?.message, MISSING_KEY_MESSAGE);
  assert.equal(check('Basic abc')?.message, MISSING_KEY_MESSAGE);
  assert.equal(check('Bearer nope')?.message, INVALID_KEY_MESSAGE);
  assert.equal(check('Bearer k1x')?.status, 401);
});
