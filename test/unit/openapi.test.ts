import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import type { HTTPMethods } from 'fastify';
import { buildServer } from '../../src/api/server.js';
import { createMetrics } from '../../src/api/metrics.js';
import type { SandboxManager } from '../../src/core/sandbox-manager.js';
import { errorCodes } from '../../src/errors.js';
import { ROOT } from '../../testkit/root.js';

interface Operation {
  security?: Record<string, string[]>[];
  responses: Record<string, { content?: Record<string, { schema?: { $ref?: string } }> }>;
}
interface OpenApiDoc {
  openapi: string;
  info: { title: string; version: string };
  paths: Record<string, Record<string, Operation | unknown>>;
  components: {
    securitySchemes: Record<string, { type: string; scheme?: string }>;
    schemas: Record<string, unknown>;
  };
}

const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

const doc = JSON.parse(readFileSync(join(ROOT, 'docs', 'openapi.json'), 'utf8')) as OpenApiDoc;

/** Every documented operation as [METHOD, OpenAPI path, operation]. */
const operations: [string, string, Operation][] = Object.entries(doc.paths).flatMap(
  ([path, item]) =>
    Object.entries(item)
      .filter(([method]) => HTTP_METHODS.includes(method))
      .map(([method, op]): [string, string, Operation] => [
        method.toUpperCase(),
        path,
        op as Operation,
      ]),
);

/** `/v1/sandboxes/{id}` -> `/v1/sandboxes/:id` (fastify's syntax). */
const toFastify = (path: string): string => path.replace(/\{([^}]+)\}/g, ':$1');

/** Parameter names erased: `/v1/sandboxes/:id` and `/v1/sandboxes/{parent}` -> `/v1/sandboxes/:`. */
const shape = (path: string): string =>
  toFastify(path)
    .split('/')
    .map((s) => (s.startsWith(':') ? ':' : s))
    .join('/');

/**
 * Parses `printRoutes({ commonPrefix: false })`, a tree such as
 *   ├── /v1/sandboxes (POST, GET, HEAD)
 *   │   └── /:id|:parent (GET, HEAD, DELETE)
 * into [METHOD, full path] pairs. A parametric node shared by routes that name the parameter
 * differently prints as `:id|:parent`; the names are kept as alternatives.
 */
function parseRoutes(printed: string): { method: string; path: string }[] {
  const stack: string[] = [];
  const routes: { method: string; path: string }[] = [];
  for (const line of printed.split('\n')) {
    if (line.trim() === '') continue;
    const m = /^((?:│ {3}| {4})*)(?:├── |└── )(\S+)(?: \(([^)]*)\))?/.exec(line);
    assert.ok(m, `unexpected printRoutes line: ${JSON.stringify(line)}`);
    const depth = m[1]!.length / 4;
    stack.length = depth;
    stack.push(m[2]!);
    for (const method of (m[3] ?? '').split(',').map((s) => s.trim())) {
      if (method !== '') routes.push({ method, path: stack.join('') });
    }
  }
  return routes;
}

/** True when a documented path (`{name}` params) is the printed route (`:a|:b` alternatives). */
function samePath(documented: string, printed: string): boolean {
  const d = toFastify(documented).split('/');
  const p = printed.split('/');
  return (
    d.length === p.length &&
    d.every((seg, i) =>
      seg.startsWith(':')
        ? p[i]!.split('|').includes(seg)
        : p[i]!.startsWith(':')
          ? false
          : seg === p[i],
    )
  );
}

test('docs/openapi.json is OpenAPI 3.1 with bearer auth', () => {
  assert.match(doc.openapi, /^3\.1\.\d+$/);
  assert.deepEqual(doc.info, { ...doc.info, title: 'hostd', version: '0.1.0' });
  assert.deepEqual(doc.components.securitySchemes.bearerAuth, {
    ...doc.components.securitySchemes.bearerAuth,
    type: 'http',
    scheme: 'bearer',
  });
  for (const name of [
    'Sandbox',
    'SandboxInfo',
    'ExecRequest',
    'ExecEvent',
    'ForkRequest',
    'ForkResponse',
    'MergeResponse',
    'Error',
  ]) {
    assert.ok(doc.components.schemas[name], `components.schemas.${name} is missing`);
  }
  assert.deepEqual(doc.components.schemas.Error, {
    ...(doc.components.schemas.Error as object),
    type: 'object',
    required: ['error', 'code'],
    additionalProperties: false,
  });
  // Every registry code is in the schema's enum, and nothing else.
  const codes = (
    doc.components.schemas.Error as unknown as { properties: { code: { enum: string[] } } }
  ).properties.code.enum;
  assert.deepEqual([...codes].sort(), [...new Set(errorCodes().keys())].sort());
});

test('every route but /v1/healthz requires the bearer key, as the auth hook does', () => {
  for (const [method, path, op] of operations) {
    const open = path === '/v1/healthz';
    assert.deepEqual(
      op.security,
      open ? [] : [{ bearerAuth: [] }],
      `${method} ${path} security should be ${open ? 'none' : 'bearerAuth'}`,
    );
  }
});

test('every $ref points at an existing component', () => {
  const text = JSON.stringify(doc);
  for (const m of text.matchAll(/"\$ref":"#\/components\/([^/"]+)\/([^"]+)"/g)) {
    const section = (doc.components as unknown as Record<string, Record<string, unknown>>)[m[1]!];
    assert.ok(section?.[m[2]!], `dangling $ref ${m[0]}`);
  }
  assert.doesNotMatch(text, /"\$ref":"(?!#\/components\/)/, 'only local component refs');
});

test('exec streams ExecEvent objects as application/x-ndjson', () => {
  const ok = doc.paths['/v1/sandboxes/{id}/exec']?.post as Operation | undefined;
  assert.ok(ok, 'POST /v1/sandboxes/{id}/exec is documented');
  const response = ok.responses['200'] as {
    description: string;
    content: Operation['responses'][string]['content'];
  };
  assert.deepEqual(Object.keys(response.content ?? {}), ['application/x-ndjson']);
  assert.equal(
    response.content?.['application/x-ndjson']?.schema?.$ref,
    '#/components/schemas/ExecEvent',
  );
  assert.match(response.description, /one JSON object .*per line/i);
});

test('error statuses are in the registry and use the Error schema', () => {
  const registry = new Set<number>(errorCodes().values());
  for (const [method, path, op] of operations) {
    for (const [status, response] of Object.entries(op.responses)) {
      if (Number(status) < 400) continue;
      assert.ok(
        registry.has(Number(status)),
        `${method} ${path} documents ${status}, which no registry kind has`,
      );
      assert.deepEqual(
        response.content,
        { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
        `${method} ${path} ${status} body`,
      );
    }
  }
});

test('the documented operations are exactly the routes the server registers', async () => {
  const app = await buildServer({
    // Only route registration matters: no handler runs, so no VM is started.
    manager: {} as unknown as SandboxManager,
    auth: { kind: 'open', why: 'loopback-no-keys' },
    maxBodyBytes: 1024,
    maxFileBytes: 1024,
    logger: pino({ level: 'silent' }),
    metrics: createMetrics({ accel: 'tcg', version: 'test' }),
  });
  try {
    await app.ready();

    // Documented -> registered.
    for (const [method, path] of operations) {
      assert.ok(
        app.hasRoute({ method: method as HTTPMethods, url: toFastify(path) }),
        `${method} ${path} is documented but the server has no such route`,
      );
    }

    // Registered -> documented. fastify adds HEAD for every GET by itself. The web console
    // (`/` and `/console` redirect to `/console/`, whose files one wildcard route serves) is
    // pages for people, not the API.
    const registered = parseRoutes(app.printRoutes({ commonPrefix: false })).filter(
      (r) =>
        r.method !== 'HEAD' &&
        !['/', '/console'].includes(r.path) &&
        !r.path.startsWith('/console/') &&
        !r.path.endsWith('*'),
    );
    assert.ok(registered.length > 0, 'printRoutes listed no routes');
    for (const r of registered) {
      assert.ok(
        operations.some(([method, path]) => method === r.method && samePath(path, r.path)),
        `${r.method} ${r.path} is served but not in docs/openapi.json`,
      );
    }

    // And the two sets have the same size once parameter names are erased.
    const key = (method: string, path: string): string => `${method} ${shape(path)}`;
    assert.deepEqual(
      [...new Set(registered.map((r) => key(r.method, r.path.replace(/:[^/]+/g, ':'))))].sort(),
      [...new Set(operations.map(([method, path]) => key(method, path)))].sort(),
    );
  } finally {
    await app.close();
  }
});
