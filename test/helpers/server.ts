/**
 * hostd's HTTP server on the fake hypervisor (test/helpers/manager.ts), driven with fastify's
 * `inject()`: route-level behaviour in milliseconds, no socket, no VM. The app is main.ts's
 * (`buildServer`, metrics bound to the manager as main.ts binds them), so the route tests
 * (test/unit/routes-*.test.ts) see the routes, hooks and error handling users get. Every answer
 * is checked as testkit checks a real hostd's: an error answer is a registry body
 * `{"error", "code"}` with a registry code, and no answer shows host details
 * (testkit/host-details.ts), and every answer is checked against the wire contract
 * (test/helpers/wire-check.ts). The routes `inject` reached are kept (`routesHit`), so that each
 * route test file can check it exercised every route of its area (test/helpers/routes.ts).
 * The E2B front's harness is e2b-server.ts.
 */
import assert from 'node:assert/strict';
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { pino, type Logger } from 'pino';
import { createMetrics } from '../../src/api/metrics.js';
import type { AuthMode } from '../../src/api/auth.js';
import { MCP_ROUTE } from '../../src/api/routes/mcp.js';
import { buildServer } from '../../src/api/server.js';
import { errorCodes } from '../../src/errors.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import { assertNoHostDetails, clientValues, errorTexts } from '../../testkit/host-details.js';
import { started } from './manager.js';
import { checkAnswer } from './wire-check.js';
import type { FakeHypervisor } from './fake-hypervisor.js';

export const API_KEY = 'test-key';
export const AUTH = { authorization: `Bearer ${API_KEY}` };

/** A request header that marks `TestServer.inject`'s requests, whose routes are kept. */
const RECORDED = 'x-test-recorded';
const hit = new Set<string>();

/**
 * The routes (`METHOD /fastify/:path`) this test process reached through `TestServer.inject`,
 * whatever the answer. Requests sent with `app.inject` directly (the unauthenticated sweeps)
 * are not counted: a route is covered by a test that speaks to it with a key.
 */
export function routesHit(): ReadonlySet<string> {
  return hit;
}

/** Counts `route` as reached by a keyed request (the E2B front's harness, e2b-server.ts). */
export function recordRoute(route: string): void {
  hit.add(route);
}

export interface ServerOverrides {
  /** The default is API keys, `API_KEY` the only one. */
  auth?: AuthMode;
}

export interface TestServer {
  app: FastifyInstance;
  manager: SandboxManager;
  hv: FakeHypervisor;
  /** `app.inject` with the API key, checking the answer (see above). */
  inject(opts: InjectOptions & { url: string }): Promise<LightMyRequestResponse>;
  close(): Promise<void>;
}

/** The JSON body of an error answer, checked to be a registry error body. */
export function errorBody(res: { statusCode: number; body: string }): {
  error: string;
  code: string;
} {
  const body = JSON.parse(res.body) as { error: string; code: string };
  assert.deepEqual(Object.keys(body).sort(), ['code', 'error'], res.body.slice(0, 300));
  assert.equal(errorCodes().get(body.code), res.statusCode, `${body.code} has its registry status`);
  return body;
}

/** A server with API-key auth over a started manager on the fake hypervisor. */
export async function startServer(
  overrides: Partial<ManagerOptions> = {},
  log: Logger = pino({ level: 'silent' }),
  server: ServerOverrides = {},
): Promise<TestServer> {
  const metrics = createMetrics({ accel: 'tcg', version: 'test' });
  const { manager, hv } = await started(overrides, log, metrics.observer);
  metrics.bind(manager);
  const app = await buildServer({
    manager,
    auth: server.auth ?? { kind: 'keys', keys: [API_KEY] },
    maxBodyBytes: 4 * 1024 * 1024,
    maxFileBytes: overrides.maxFileBytes ?? 1024,
    logger: log,
    metrics,
  });
  app.addHook('onRequest', async (req) => {
    const route = req.routeOptions.url;
    if (route !== undefined && req.headers[RECORDED] !== undefined)
      hit.add(`${req.method} ${route}`);
  });
  return {
    app,
    manager,
    hv,
    async inject(opts) {
      const res = await app.inject({
        ...opts,
        headers: { ...AUTH, [RECORDED]: '1', ...opts.headers },
      });
      const where = `${opts.method ?? 'GET'} ${opts.url.slice(0, 100)} (${res.statusCode})`;
      // /mcp's protocol errors are JSON-RPC messages, as the MCP transport specifies them.
      if (res.statusCode >= 300 && !opts.url.startsWith(MCP_ROUTE)) {
        errorBody(res);
        assertNoHostDetails(where, res.body, [], clientValues(opts.url));
      } else if (res.headers['content-type']?.toString().startsWith('application/json')) {
        for (const e of errorTexts(JSON.parse(res.body))) assertNoHostDetails(where, e, []);
      }
      if (!opts.url.startsWith(MCP_ROUTE)) checkAnswer(opts.method ?? 'GET', opts.url, res);
      return res;
    },
    async close() {
      await app.close();
      await manager.shutdown();
    },
  };
}
