/**
 * The API's routes as docs/openapi.json documents them, each given to the route test file of its
 * area (test/unit/routes-<area>.test.ts). Each of those files ends by checking that it reached
 * every route of its area through the inject harness (`assertAreaCovered`), and
 * test/unit/routes-contract.test.ts checks that the areas hold exactly the documented routes, so
 * a route added to the server and the OpenAPI file (openapi.test.ts keeps those two equal)
 * cannot go without an inject test.
 *
 * The E2B front's data plane (docs/e2b.md: envd and the code interpreter) speaks E2B's
 * protocols, not hostd's, and is not in docs/openapi.json: its routes are E2B_ROUTE_AREAS, which
 * routes-contract.test.ts checks against the routes the front registers, and its route test
 * files end with the same `assertAreaCovered`.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../testkit/root.js';
import { routesHit } from './server.js';

export type Area =
  | 'service'
  | 'sandboxes'
  | 'exec'
  | 'files'
  | 'lineage'
  | 'snapshots'
  | 'templates'
  | 'contexts'
  | 'cluster'
  | 'mcp'
  | E2bArea;

/** The E2B front's data-plane areas: test/unit/routes-e2b-envd.test.ts and -interpreter. */
export type E2bArea = 'e2b-envd' | 'e2b-interpreter';
/** Which data plane a request is for, by its `E2b-Sandbox-Port` (49983, 49999). */
export type DataPlane = 'envd' | 'interpreter';

/** `PLANE METHOD /fastify/:path` -> the area whose route test file covers it. */
export const E2B_ROUTE_AREAS: Readonly<Record<string, E2bArea>> = {
  'envd GET /health': 'e2b-envd',
  'envd POST /process.Process/Start': 'e2b-envd',
  'envd POST /process.Process/Connect': 'e2b-envd',
  'envd POST /process.Process/List': 'e2b-envd',
  'envd POST /process.Process/SendInput': 'e2b-envd',
  'envd POST /process.Process/CloseStdin': 'e2b-envd',
  'envd POST /process.Process/SendSignal': 'e2b-envd',
  'envd POST /process.Process/Update': 'e2b-envd',
  'envd POST /filesystem.Filesystem/Stat': 'e2b-envd',
  'envd POST /filesystem.Filesystem/MakeDir': 'e2b-envd',
  'envd POST /filesystem.Filesystem/Move': 'e2b-envd',
  'envd POST /filesystem.Filesystem/ListDir': 'e2b-envd',
  'envd POST /filesystem.Filesystem/Remove': 'e2b-envd',
  'envd POST /filesystem.Filesystem/WatchDir': 'e2b-envd',
  'envd POST /filesystem.Filesystem/CreateWatcher': 'e2b-envd',
  'envd POST /filesystem.Filesystem/GetWatcherEvents': 'e2b-envd',
  'envd POST /filesystem.Filesystem/RemoveWatcher': 'e2b-envd',
  'envd GET /files': 'e2b-envd',
  'envd POST /files': 'e2b-envd',
  'interpreter POST /execute': 'e2b-interpreter',
  'interpreter POST /contexts': 'e2b-interpreter',
  'interpreter GET /contexts': 'e2b-interpreter',
  'interpreter DELETE /contexts/:context': 'e2b-interpreter',
  'interpreter POST /contexts/:context/restart': 'e2b-interpreter',
  'interpreter GET /health': 'e2b-interpreter',
};

/** `METHOD /openapi/{path}` -> the area whose route test file covers it. */
export const ROUTE_AREAS: Readonly<Record<string, Area>> = {
  'GET /v1/healthz': 'service',
  'GET /metrics': 'service',
  'POST /v1/sandboxes': 'sandboxes',
  'GET /v1/sandboxes': 'sandboxes',
  'GET /v1/sandboxes/{id}': 'sandboxes',
  'DELETE /v1/sandboxes/{id}': 'sandboxes',
  'GET /v1/sandboxes/{id}/logs': 'sandboxes',
  'POST /v1/sandboxes/{id}/timeout': 'sandboxes',
  'POST /v1/sandboxes/{id}/pause': 'sandboxes',
  'POST /v1/sandboxes/{id}/resume': 'sandboxes',
  'POST /v1/sandboxes/{id}/exec': 'exec',
  'PUT /v1/sandboxes/{id}/files': 'files',
  'GET /v1/sandboxes/{id}/files': 'files',
  'DELETE /v1/sandboxes/{id}/files': 'files',
  'GET /v1/sandboxes/{id}/files/list': 'files',
  'GET /v1/sandboxes/{id}/files/stat': 'files',
  'POST /v1/sandboxes/{id}/files/mkdir': 'files',
  'POST /v1/sandboxes/{id}/files/move': 'files',
  'POST /v1/sandboxes/{id}/fork': 'lineage',
  'POST /v1/sandboxes/{parent}/merge_into/{winner}': 'lineage',
  'POST /v1/sandboxes/{id}/snapshot': 'snapshots',
  'GET /v1/snapshots': 'snapshots',
  'GET /v1/snapshots/{id}': 'snapshots',
  'DELETE /v1/snapshots/{id}': 'snapshots',
  'GET /v1/templates': 'templates',
  'GET /v1/templates/{name}': 'templates',
  'GET /v1/templates/{name}/log': 'templates',
  'POST /v1/sandboxes/{id}/contexts': 'contexts',
  'GET /v1/sandboxes/{id}/contexts': 'contexts',
  'DELETE /v1/sandboxes/{id}/contexts/{context}': 'contexts',
  'POST /v1/sandboxes/{id}/contexts/{context}/restart': 'contexts',
  'GET /v1/cluster': 'cluster',
  'POST /v1/cluster/nodes/{id}/drain': 'cluster',
  'POST /v1/cluster/nodes/{id}/undrain': 'cluster',
  'DELETE /v1/cluster/nodes/{id}': 'cluster',
  'GET /v1/cluster/peer/files': 'cluster',
  'POST /v1/cluster/peer/sandboxes/{id}/hand-over': 'cluster',
  'GET /v1/cluster/peer/snapshots/{id}/export': 'cluster',
  'POST /v1/cluster/peer/snapshots/{id}/hand-over': 'cluster',
  'POST /mcp': 'mcp',
  'GET /mcp': 'mcp',
  'DELETE /mcp': 'mcp',
};

export interface Operation {
  method: string;
  /** OpenAPI syntax: `/v1/sandboxes/{id}`. */
  path: string;
  /** The statuses it documents. */
  statuses: number[];
  /** Whether it takes `Authorization: Bearer <key>`. */
  guarded: boolean;
}

const METHODS = ['get', 'put', 'post', 'delete', 'patch'];

/** Every operation docs/openapi.json documents. */
export function documentedOperations(): Operation[] {
  const doc = JSON.parse(readFileSync(join(ROOT, 'docs', 'openapi.json'), 'utf8')) as {
    paths: Record<string, Record<string, { responses: object; security?: unknown[] }>>;
  };
  return Object.entries(doc.paths).flatMap(([path, item]) =>
    Object.entries(item)
      .filter(([method]) => METHODS.includes(method))
      .map(([method, op]) => ({
        method: method.toUpperCase(),
        path,
        statuses: Object.keys(op.responses).map(Number),
        guarded: (op.security ?? []).length > 0,
      })),
  );
}

/** `/v1/sandboxes/{id}` -> `/v1/sandboxes/:id`, as fastify names the route. */
export const toFastify = (path: string): string => path.replace(/\{([^}]+)\}/g, ':$1');

/**
 * Fails with the routes of `area` this test process did not reach through the harness's
 * `inject`: the last test of each route test file.
 */
export function assertAreaCovered(area: Area): void {
  const native = Object.entries(ROUTE_AREAS)
    .filter(([, a]) => a === area)
    .map(([op]) => {
      const [method, path] = op.split(' ') as [string, string];
      return `${method} ${toFastify(path)}`;
    });
  const e2b = Object.entries(E2B_ROUTE_AREAS)
    .filter(([, a]) => a === area)
    .map(([route]) => route);
  const missing = [...native, ...e2b].filter((route) => !routesHit().has(route));
  assert.deepEqual(missing, [], `routes of the ${area} area that no test here reached`);
}
