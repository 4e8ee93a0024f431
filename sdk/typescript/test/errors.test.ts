/**
 * Error classes: every code of docs/api.md maps onto its class, a response without a code onto
 * the class of its status, the error keeps code, status, message and Retry-After, the first
 * SDK version's classes still catch what they caught, and errors are recognisable across two
 * copies of the package.
 */
import assert from 'node:assert/strict';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import {
  AuthenticationError,
  ConnectionError,
  ContextExistsError,
  ContextNotFoundError,
  ExecutorError,
  HostdError,
  InsufficientResourcesError,
  InsufficientStorageError,
  InvalidRequestError,
  LimitReachedError,
  NotFoundError,
  RateLimitError,
  RouteNotFoundError,
  Sandbox,
  SandboxDiskFullError,
  SandboxFileNotFoundError,
  SandboxLostError,
  SandboxNotFoundError,
  ShuttingDownError,
  SnapshotNotFoundError,
  StorageLimitError,
  TemplateFailedError,
  TemplateNotFoundError,
  TemplateUnavailableError,
  UnavailableError,
  errorFromResponse,
  isHostdError,
} from '../src/index.js';
import { sendError, startFakeHostd, type FakeHostd } from './helpers/fake-hostd.js';
import { PACKAGE_DIR, REPO_ROOT } from './helpers/live.js';

type ErrorClass = abstract new (...args: never[]) => HostdError;

/** The class each code of docs/api.md's Errors table must become. */
const BY_CODE: Record<string, ErrorClass> = {
  invalid_request: InvalidRequestError,
  merge_into_self: InvalidRequestError,
  invalid_path: InvalidRequestError,
  is_a_directory: InvalidRequestError,
  not_a_directory: InvalidRequestError,
  invalid_archive: InvalidRequestError,
  unsupported_file: InvalidRequestError,
  permission_denied: InvalidRequestError,
  missing_api_key: AuthenticationError,
  invalid_api_key: AuthenticationError,
  sandbox_not_found: SandboxNotFoundError,
  template_not_found: TemplateNotFoundError,
  snapshot_not_found: SnapshotNotFoundError,
  file_not_found: SandboxFileNotFoundError,
  route_not_found: RouteNotFoundError,
  context_not_found: ContextNotFoundError,
  context_exists: ContextExistsError,
  context_is_default: InvalidRequestError,
  sandbox_lost: SandboxLostError,
  body_too_large: InvalidRequestError,
  file_too_large: InvalidRequestError,
  unsupported_media_type: InvalidRequestError,
  headers_too_large: InvalidRequestError,
  request_timeout: InvalidRequestError,
  limit_reached: RateLimitError,
  client_closed_request: InvalidRequestError,
  executor_error: ExecutorError,
  template_failed: TemplateFailedError,
  internal_error: ExecutorError,
  insufficient_resources: InsufficientResourcesError,
  template_unavailable: TemplateUnavailableError,
  shutting_down: ShuttingDownError,
  sandbox_disk_full: SandboxDiskFullError,
  storage_limit_reached: StorageLimitError,
  // Cluster mode's codes take the class of their status.
  node_not_found: NotFoundError,
  not_clustered: InvalidRequestError,
  sandboxes_on_different_nodes: InvalidRequestError,
  cluster_conflict: InvalidRequestError,
  cluster_unavailable: UnavailableError,
  node_unavailable: UnavailableError,
  sandbox_moving: UnavailableError,
  node_draining: UnavailableError,
  hand_over_failed: UnavailableError,
};

/** `| 404 | `sandbox_not_found` | ...` rows of docs/api.md's Errors section. */
async function documentedCodes(): Promise<Array<[number, string]>> {
  const doc = await readFile(join(REPO_ROOT, 'docs', 'api.md'), 'utf8');
  const section = doc.slice(doc.indexOf('\n## Errors'), doc.indexOf('\n## Limits'));
  return [...section.matchAll(/^\| (\d{3}) \| `([a-z_]+)` \|/gm)].map((m) => [Number(m[1]), m[2]!]);
}

describe('errors by code', () => {
  test('every code of docs/api.md becomes its class, keeping code, status and message', async () => {
    const codes = await documentedCodes();
    assert.ok(codes.length >= 26, `only ${codes.length} codes found in docs/api.md`);
    assert.deepEqual(codes.map(([, code]) => code).sort(), Object.keys(BY_CODE).sort());
    for (const [status, code] of codes) {
      const err = errorFromResponse({ status, code, message: `message for ${code}` });
      assert.equal(err.constructor, BY_CODE[code], code);
      assert.equal(err.code, code);
      assert.equal(err.status, status);
      assert.equal(err.message, `message for ${code}`);
      assert.equal(err.name, BY_CODE[code]!.name);
      assert.ok(err instanceof HostdError && err instanceof Error);
    }
  });

  test('the first version’s classes still catch what they caught', () => {
    const of = (status: number, code: string): HostdError =>
      errorFromResponse({ status, code, message: 'm' });
    for (const code of ['sandbox_not_found', 'template_not_found', 'snapshot_not_found']) {
      assert.ok(of(404, code) instanceof NotFoundError, code);
    }
    assert.ok(of(410, 'sandbox_lost') instanceof NotFoundError);
    assert.ok(of(404, 'file_not_found') instanceof NotFoundError);
    assert.ok(of(500, 'template_failed') instanceof ExecutorError);
    for (const code of ['insufficient_resources', 'template_unavailable', 'shutting_down']) {
      assert.ok(of(503, code) instanceof UnavailableError, code);
    }
    assert.equal(LimitReachedError, RateLimitError);
    assert.ok(of(429, 'limit_reached') instanceof LimitReachedError);
    assert.ok(of(507, 'sandbox_disk_full') instanceof InsufficientStorageError);
    assert.ok(of(507, 'storage_limit_reached') instanceof InsufficientStorageError);
  });

  test('isHostdError matches the exact code and the codes of parent classes', () => {
    const err = errorFromResponse({ status: 404, code: 'sandbox_not_found', message: 'm' });
    assert.ok(isHostdError(err, 'sandbox_not_found'));
    assert.ok(isHostdError(err, 'not_found'));
    assert.ok(isHostdError(err, 'hostd_error'));
    assert.equal(isHostdError(err, 'template_not_found'), false);
    assert.equal(err instanceof TemplateNotFoundError, false);
  });

  test('an unknown code takes the class of its status and keeps its code', () => {
    const err = errorFromResponse({ status: 404, code: 'widget_not_found', message: 'm' });
    assert.equal(err.constructor, NotFoundError);
    assert.equal(err.code, 'widget_not_found');
    const later = errorFromResponse({ status: 503, code: 'maintenance', message: 'm' });
    assert.equal(later.constructor, UnavailableError);
  });
});

const byStatus: Array<[number, ErrorClass, string]> = [
  [400, InvalidRequestError, 'invalid_request'],
  [401, AuthenticationError, 'authentication_error'],
  [403, AuthenticationError, 'authentication_error'],
  [404, NotFoundError, 'not_found'],
  [405, InvalidRequestError, 'invalid_request'],
  [410, SandboxLostError, 'sandbox_lost'],
  [413, InvalidRequestError, 'invalid_request'],
  [415, InvalidRequestError, 'invalid_request'],
  [429, RateLimitError, 'limit_reached'],
  [500, ExecutorError, 'executor_error'],
  [502, UnavailableError, 'unavailable'],
  [503, UnavailableError, 'unavailable'],
  [507, InsufficientStorageError, 'insufficient_storage'],
  [501, HostdError, 'hostd_error'],
];

describe('errors from a server that sends no code', () => {
  let fake: FakeHostd;
  before(async () => {
    fake = await startFakeHostd();
  });
  after(() => fake.close());

  for (const [status, cls, code] of byStatus) {
    test(`${status} is ${cls.name} with code ${code} and the server's message`, async () => {
      fake.handle((_req, res) => sendError(res, status, `message for ${status}`));
      const err = await Sandbox.create({ baseUrl: fake.url, maxRetries: 0 }).then(
        () => assert.fail('expected a rejection'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof cls, `got ${String(err)}`);
      assert.equal((err as HostdError).constructor, cls);
      assert.equal((err as HostdError).code, code);
      assert.equal((err as HostdError).status, status);
      assert.equal((err as HostdError).message, `message for ${status}`);
      assert.ok(isHostdError(err, code));
    });
  }

  test('a coded answer over HTTP keeps code, status, message and Retry-After', async () => {
    fake.handle((_req, res) =>
      sendError(res, 503, 'template "python" is not available: building', 'template_unavailable', {
        'retry-after': '40',
      }),
    );
    const err = await Sandbox.create({ baseUrl: fake.url }).then(
      () => assert.fail('expected a rejection'),
      (e: unknown) => e as HostdError,
    );
    assert.ok(err instanceof TemplateUnavailableError);
    assert.equal(err.code, 'template_unavailable');
    assert.equal(err.status, 503);
    assert.equal(err.retryAfterMs, 40_000);
  });

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
      const foreign = other.errorFromResponse({
        status: 404,
        code: 'sandbox_not_found',
        message: 'sandbox x not found',
      });
      assert.ok(isHostdError(foreign, 'sandbox_not_found'));
      assert.ok(foreign instanceof SandboxNotFoundError);
      assert.ok(foreign instanceof NotFoundError);
      assert.ok(foreign instanceof HostdError);
      assert.equal(foreign instanceof SnapshotNotFoundError, false);
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
