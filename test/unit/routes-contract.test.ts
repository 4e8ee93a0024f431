/**
 * What holds on every route of docs/openapi.json, table-driven over the file itself: the key is
 * required as the Authentication section says (before anything else, even on unknown ids), a
 * method the route does not have is `404 route_not_found` (the contract has no 405), an unknown
 * or malformed id is its resource's not-found error, and every route belongs to a route test
 * file that exercises it (test/helpers/routes.ts). Each area's own behaviour (validation,
 * success statuses, headers) is in test/unit/routes-<area>.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { HTTPMethods } from 'fastify';
import { Errors } from '../../src/errors.js';
import {
  E2B_ROUTE_AREAS,
  ROUTE_AREAS,
  documentedOperations,
  toFastify,
  type Operation,
} from '../helpers/routes.js';
import { registeredDataPlaneRoutes } from '../helpers/e2b-server.js';
import { capturedLog } from '../helpers/manager.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

const operations = documentedOperations();
const UNKNOWN_SANDBOX = `sbx_${'0'.repeat(32)}`;
const UNKNOWN_SNAPSHOT = `snap_${'0'.repeat(32)}`;

/** The operation's path with its parameters filled in by `ids`. */
function urlOf(op: Operation, ids: Record<string, string>): string {
  return op.path.replace(/\{([^}]+)\}/g, (_m, name: string) => ids[name] ?? `no-id-for-${name}`);
}

/** Unknown but well-formed values of each path parameter, per route. */
function unknownIds(op: Operation): Record<string, string> {
  if (op.path.startsWith('/v1/snapshots/')) return { id: UNKNOWN_SNAPSHOT };
  if (op.path.startsWith('/v1/cluster/')) return { id: 'node-unknown' };
  return {
    id: UNKNOWN_SANDBOX,
    parent: UNKNOWN_SANDBOX,
    winner: `sbx_${'f'.repeat(32)}`,
    context: 'c1',
    name: 'no-such-template',
  };
}

/** A request each route accepts but for the ids: the query and body a client would send. */
const VALID: Record<string, { query?: string; body?: unknown }> = {
  'POST /v1/sandboxes/{id}/exec': { body: { code: 'print 1' } },
  'POST /v1/sandboxes/{id}/fork': { body: { n: 1 } },
  'POST /v1/sandboxes/{id}/timeout': { body: { timeout: 60 } },
  'PUT /v1/sandboxes/{id}/files': { query: '?path=/tmp/x' },
  'GET /v1/sandboxes/{id}/files': { query: '?path=/tmp/x' },
  'DELETE /v1/sandboxes/{id}/files': { query: '?path=/tmp/x' },
  'GET /v1/sandboxes/{id}/files/list': { query: '?path=/tmp' },
  'GET /v1/sandboxes/{id}/files/stat': { query: '?path=/tmp' },
  'POST /v1/sandboxes/{id}/files/mkdir': { query: '?path=/tmp/d' },
  'POST /v1/sandboxes/{id}/files/move': { query: '?path=/tmp/x&to=/tmp/y' },
};

/** The not-found code an unknown id in this route's path gets. */
function notFoundCode(op: Operation): string {
  if (op.path.startsWith('/v1/snapshots/')) return Errors.snapshotNotFound.code;
  if (op.path.startsWith('/v1/templates/')) return Errors.templateNotFound.code;
  return Errors.sandboxNotFound.code;
}

const key = (op: Operation): string => `${op.method} ${op.path}`;

describe('every documented route', () => {
  let s: TestServer;
  before(async () => {
    s = await startServer();
  });
  after(() => s.close());

  const send = (op: Operation, url: string, headers: Record<string, string>) =>
    s.app.inject({ method: op.method as HTTPMethods, url, headers });

  test('without a key is 401 missing_api_key, /v1/healthz alone answering', async () => {
    for (const op of operations) {
      const res = await send(op, urlOf(op, unknownIds(op)), {});
      if (!op.guarded) {
        assert.equal(res.statusCode, 200, key(op));
        continue;
      }
      assert.ok(op.statuses.includes(401), `${key(op)} documents its 401`);
      assert.equal(res.statusCode, 401, key(op));
      // The contract fixes the message as well as the code.
      assert.deepEqual(errorBody(res), {
        error: Errors.missingApiKey.message(),
        code: Errors.missingApiKey.code,
      });
      assert.equal(res.headers['content-type'], 'application/json; charset=utf-8', key(op));
    }
  });

  test('a key that is not Bearer is 401 missing_api_key; an unlisted key is 401 invalid_api_key', async () => {
    for (const op of operations.filter((o) => o.guarded)) {
      const url = urlOf(op, unknownIds(op));
      for (const [authorization, code] of [
        ['Basic dGVzdC1rZXk=', Errors.missingApiKey.code],
        ['Bearer', Errors.missingApiKey.code],
        ['Bearer not-the-key', Errors.invalidApiKey.code],
        ['Bearer test-keyx', Errors.invalidApiKey.code],
      ] as const) {
        const res = await send(op, url, { authorization });
        assert.equal(res.statusCode, 401, `${key(op)} with ${authorization}`);
        assert.equal(errorBody(res).code, code, `${key(op)} with ${authorization}`);
      }
    }
  });

  test('percent-encoded paths reach the route they name, and its auth', async () => {
    for (const [method, url] of [
      ['POST', '/%761/sandboxes'],
      ['GET', '/%76%31/sandboxes'],
      ['GET', '/%6detrics'],
      ['GET', '/v1/%73andboxes'],
      ['DELETE', `/v1/sandboxes/${UNKNOWN_SANDBOX}`],
    ] as const) {
      const res = await s.app.inject({ method, url });
      assert.equal(res.statusCode, 401, `${method} ${url}`);
      assert.equal(errorBody(res).code, Errors.missingApiKey.code);
    }
  });

  test('an unknown path is 404 route_not_found, with or without a key', async () => {
    for (const url of ['/v1/nothing-here', '/v2/sandboxes', '/v1/sandboxes/x/y/z']) {
      for (const res of [
        await s.inject({ method: 'GET', url }),
        await s.app.inject({ method: 'GET', url }),
      ]) {
        assert.equal(res.statusCode, 404, url);
        assert.equal(errorBody(res).code, Errors.routeNotFound.code, url);
      }
    }
  });

  test('a method the route does not have is 404 route_not_found, with or without a key', async () => {
    const paths = [...new Set(operations.map((o) => o.path))];
    for (const path of paths) {
      const ops = operations.filter((o) => o.path === path);
      const has = new Set(ops.map((o) => o.method));
      const url = urlOf(ops[0]!, unknownIds(ops[0]!));
      for (const method of ['GET', 'PUT', 'POST', 'DELETE', 'PATCH'] as const) {
        if (has.has(method)) continue;
        for (const withKey of [true, false]) {
          const res = withKey
            ? await s.inject({ method, url })
            : await s.app.inject({ method, url });
          assert.equal(res.statusCode, 404, `${method} ${path}`);
          assert.equal(errorBody(res).code, Errors.routeNotFound.code, `${method} ${path}`);
        }
      }
    }
  });

  test('an unknown id, or one that cannot be an id, is its resource not found', async () => {
    const withIds = operations.filter(
      (o) => o.path.includes('{') && !o.path.startsWith('/v1/cluster/'),
    );
    assert.ok(withIds.length > 20, 'the routes that take ids');
    for (const op of withIds) {
      const { query = '', body } = VALID[key(op)] ?? {};
      for (const bad of ['unknown', 'nope', 'sbx_XYZ', '..%2F..%2Fetc', `sbx_${'a'.repeat(31)}`]) {
        const ids =
          bad === 'unknown'
            ? unknownIds(op)
            : // The resource the route names first; a malformed context id is the contexts file's.
              { ...unknownIds(op), id: bad, parent: bad, name: bad };
        const res = await s.inject({
          method: op.method as HTTPMethods,
          url: urlOf(op, ids) + query,
          ...(body === undefined ? {} : { payload: body as object }),
        });
        assert.equal(res.statusCode, 404, `${key(op)} ${bad}: ${res.body}`);
        assert.ok(op.statuses.includes(404), `${key(op)} documents its 404`);
        assert.equal(errorBody(res).code, notFoundCode(op), `${key(op)} ${bad}`);
      }
    }
  });
});

test("a bug is 500 internal_error naming the request id hostd's log has, and nothing else", async () => {
  const { log, lines } = capturedLog();
  const s = await startServer({}, log);
  try {
    s.manager.describe = () => {
      throw new Error('boom at /var/lib/hostd/sandboxes/x.json');
    };
    const res = await s.inject({ method: 'GET', url: `/v1/sandboxes/${UNKNOWN_SANDBOX}` });
    assert.equal(res.statusCode, 500);
    const body = errorBody(res);
    assert.equal(body.code, Errors.internal.code);
    const logged = lines.find((l) => l.msg === 'internal error');
    assert.ok(logged, 'the error is logged');
    assert.equal(body.error, Errors.internal.message(String(logged.reqId)));
  } finally {
    await s.close();
  }
});

describe('the route test files', () => {
  test('every documented route belongs to an area, and every area route is documented', () => {
    assert.deepEqual(
      Object.keys(ROUTE_AREAS).sort(),
      operations.map(key).sort(),
      'test/helpers/routes.ts ROUTE_AREAS against docs/openapi.json',
    );
  });

  test("every route of the E2B front's data plane belongs to an area, and no other", async () => {
    assert.deepEqual(
      Object.keys(E2B_ROUTE_AREAS).sort(),
      await registeredDataPlaneRoutes(),
      'test/helpers/routes.ts E2B_ROUTE_AREAS against the routes envd and the interpreter register',
    );
  });

  test('every area has its route test file', () => {
    const here = dirname(fileURLToPath(import.meta.url));
    const areas = [...Object.values(ROUTE_AREAS), ...Object.values(E2B_ROUTE_AREAS)];
    for (const area of new Set(areas)) {
      assert.ok(existsSync(join(here, `routes-${area}.test.js`)), `routes-${area}.test.ts`);
    }
  });

  test('fastify names the routes as the table does', async () => {
    const s = await startServer();
    try {
      await s.app.ready();
      for (const op of operations) {
        assert.ok(
          s.app.hasRoute({ method: op.method as HTTPMethods, url: toFastify(op.path) }),
          key(op),
        );
      }
    } finally {
      await s.close();
    }
  });
});
