/**
 * Error classes: every status maps onto its class with the server's message, codes are stable,
 * and errors are recognisable across two copies of the package.
 */
import assert from 'node:assert/strict';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import {
  AuthenticationError,
  ConnectionError,
  ExecutorError,
  HostdError,
  InvalidRequestError,
  LimitReachedError,
  NotFoundError,
  Sandbox,
  UnavailableError,
  isHostdError,
  type HostdErrorCode,
} from '../src/index.js';
import { sendError, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';
import { PACKAGE_DIR } from './helpers/live.js';

const cases: Array<[number, new (...args: never[]) => HostdError, HostdErrorCode]> = [
  [400, InvalidRequestError, 'invalid_request'],
  [401, AuthenticationError, 'authentication_error'],
  [403, AuthenticationError, 'authentication_error'],
  [404, NotFoundError, 'not_found'],
  [405, InvalidRequestError, 'invalid_request'],
  [413, InvalidRequestError, 'invalid_request'],
  [415, InvalidRequestError, 'invalid_request'],
  [429, LimitReachedError, 'limit_reached'],
  [500, ExecutorError, 'executor_error'],
  [502, UnavailableError, 'unavailable'],
  [503, UnavailableError, 'unavailable'],
  [501, HostdError, 'hostd_error'],
];

describe('errors from HTTP statuses', () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd();
  });
  after(() => fake.close());

  for (const [status, cls, code] of cases) {
    test(`${status} is ${cls.name} with code ${code} and the server's message`, async () => {
      fake.handle((_req, res) => sendError(res, status, `message for ${status}`));
      const err = await Sandbox.create({ baseUrl: fake.url }).then(
        () => assert.fail('expected a rejection'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof cls, `got ${String(err)}`);
      assert.ok(err instanceof HostdError);
      assert.ok(err instanceof Error);
      assert.equal(err.code, code);
      assert.equal(err.status, status);
      assert.equal(err.message, `message for ${status}`);
      assert.equal(err.name, cls.name);
      assert.ok(isHostdError(err, code));
      assert.ok(isHostdError(err));
    });
  }

  test('a body that is not JSON still gives a readable message', async () => {
    fake.handle((_req, res) => {
      res.writeHead(502, { 'content-type': 'text/html' });
      res.end('<html>Bad Gateway</html>');
    });
    await assert.rejects(Sandbox.create({ baseUrl: fake.url }), (e: unknown) => {
      assert.ok(e instanceof UnavailableError);
      assert.equal(e.message, '<html>Bad Gateway</html>');
      return true;
    });
  });

  test('an empty error body gives the status line', async () => {
    fake.handle((_req, res) => {
      res.writeHead(500);
      res.end();
    });
    await assert.rejects(Sandbox.create({ baseUrl: fake.url }), {
      name: 'ExecutorError',
      message: 'HTTP 500 Internal Server Error',
    });
  });

  test('no server at all is a ConnectionError', async () => {
    const closed = await startFakeHostd();
    const url = closed.url;
    await closed.close();
    await assert.rejects(Sandbox.create({ baseUrl: url }), (e: unknown) => {
      assert.ok(e instanceof ConnectionError);
      assert.equal(e.code, 'connection_error');
      assert.equal(e.status, undefined);
      assert.match(e.message, /cannot reach hostd at http:\/\/127\.0\.0\.1:\d+: ECONNREFUSED/);
      return true;
    });
  });
});

describe('isHostdError and instanceof', () => {
  test('reject things that are not SDK errors', () => {
    assert.equal(isHostdError(new Error('x')), false);
    assert.equal(isHostdError({ code: 'not_found' }), false);
    assert.equal(isHostdError(null), false);
    assert.equal(isHostdError('not_found'), false);
    assert.equal(new Error('x') instanceof HostdError, false);
  });

  test('a subclass is its own kind and not the others', () => {
    const e = new NotFoundError('gone', { status: 404 });
    assert.ok(isHostdError(e, 'not_found'));
    assert.equal(isHostdError(e, 'executor_error'), false);
    assert.equal(e instanceof ExecutorError, false);
    assert.ok(e instanceof NotFoundError);
  });

  test('errors from another copy of the package are recognised, by code and by instanceof', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'hostd-sdk-copy-'));
    try {
      await cp(join(PACKAGE_DIR, 'dist', 'src'), join(dir, 'src'), { recursive: true });
      await writeFile(join(dir, 'package.json'), '{"type":"module"}');
      const other = (await import(
        pathToFileURL(join(dir, 'src', 'index.js')).href
      )) as typeof import('../src/index.js');
      assert.notEqual(other.NotFoundError, NotFoundError, 'the copy must be a distinct module');
      const foreign = new other.NotFoundError('sandbox x not found', { status: 404 });
      assert.ok(isHostdError(foreign, 'not_found'));
      assert.ok(foreign instanceof NotFoundError);
      assert.ok(foreign instanceof HostdError);
      assert.equal(foreign instanceof AuthenticationError, false);
      const ours = new ExecutorError('vm died');
      assert.ok(other.isHostdError(ours, 'executor_error'));
      assert.ok(ours instanceof other.ExecutorError);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('user subclasses keep the ordinary instanceof', () => {
    class MyError extends NotFoundError {}
    assert.equal(new NotFoundError('x') instanceof MyError, false);
    assert.ok(new MyError('x') instanceof NotFoundError);
  });
});
