/**
 * The E2B front (docs/e2b.md) as main.ts builds it, over its own manager on the fake hypervisor,
 * driven with fastify's `inject()`: the control plane with `X-API-KEY`, and the data plane (envd
 * on `E2b-Sandbox-Port: 49983`, the code interpreter on 49999) with a sandbox's headers and
 * tokens, as E2B's SDKs send them. Every answer is checked for the shape E2B's clients read:
 *
 * - control plane and envd's REST routes: `{code: <the status>, message}`, with hostd's
 *   `error_code` where the front adds it (envd's `/files` words its own errors as envd does);
 * - Connect RPCs: a unary error is `{code: <connect code>, message}` with that code's status
 *   (502 for a sandbox that is not running, as E2B's proxy answers); a server stream is 200 and
 *   whole envelopes, the last one flagged end-stream;
 * - `/execute`: NDJSON lines, `end_of_execution` last;
 *
 * and no answer shows host details (testkit/host-details.ts). The data-plane routes each
 * request reached are kept, so that each route test file can check it covered its area
 * (test/helpers/routes.ts, E2B_ROUTE_AREAS).
 */
import assert from 'node:assert/strict';
import Fastify, { type FastifyInstance, type InjectOptions } from 'fastify';
import type { LightMyRequestResponse } from 'fastify';
import { pino, type Logger } from 'pino';
import { SandboxTokens } from '../../src/api/e2b/auth.js';
import { makeContext, StopWatch } from '../../src/api/e2b/context.js';
import { registerEnvdRoutes } from '../../src/api/e2b/envd.js';
import { CONNECT_STATUS, isConnectPath, type ConnectCode } from '../../src/api/e2b/errors.js';
import { registerHealthRoute } from '../../src/api/e2b/health.js';
import { registerInterpreterRoutes } from '../../src/api/e2b/interpreter.js';
import { buildE2bServer } from '../../src/api/e2b/server.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import { errorCodes } from '../../src/errors.js';
import { assertNoHostDetails, clientValues } from '../../testkit/host-details.js';
import type { FakeHypervisor } from './fake-hypervisor.js';
import { setup, started } from './manager.js';
import { E2B_ROUTE_AREAS, type DataPlane } from './routes.js';
import { recordRoute } from './server.js';

export const E2B_KEY = 'e2b-test-key';
export const ENVD = '49983';
export const INTERPRETER = '49999';

type Request = InjectOptions & { url: string };
type Response = LightMyRequestResponse;

/** A sandbox made through the control plane, with the tokens its create answer carries. */
export interface E2bSandbox {
  id: string;
  /** `envdAccessToken`: `X-Access-Token` on envd and the interpreter. */
  accessToken: string;
  /** `trafficAccessToken`: `E2B-Traffic-Access-Token` on the interpreter. */
  trafficToken: string;
}

export interface TestE2bServer {
  app: FastifyInstance;
  manager: SandboxManager;
  hv: FakeHypervisor;
  /** `app.inject` on the control plane with the API key (`X-API-KEY`). */
  inject(opts: Request): Promise<Response>;
  /** Creates a running sandbox (of `body`'s template, `base` by default) with the API key. */
  sandbox(body?: object): Promise<E2bSandbox>;
  /**
   * `app.inject` to `sandbox`'s envd: `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and its
   * access token, each replaced by `opts.headers` (`undefined` leaves it out).
   */
  envd(sandbox: E2bSandbox, opts: Request): Promise<Response>;
  /** As `envd`, to the code interpreter (`E2b-Sandbox-Port: 49999`). */
  interpreter(sandbox: E2bSandbox, opts: Request): Promise<Response>;
  close(): Promise<void>;
}

/** E2B's REST error body, checked to carry the answer's status and a registry code. */
export function e2bErrorBody(res: { statusCode: number; body: string }): {
  code: number;
  message: string;
  error_code: string;
} {
  const body = JSON.parse(res.body) as { code: number; message: string; error_code: string };
  assert.deepEqual(Object.keys(body).sort(), ['code', 'error_code', 'message'], res.body);
  assert.equal(body.code, res.statusCode, 'the body carries the status');
  assertRegistryCode(body.error_code);
  return body;
}

function assertRegistryCode(code: string): void {
  const known = errorCodes().get(code) ?? errorCodes('e2b').get(code);
  assert.ok(known !== undefined, `${code} is a registry code`);
}

/** A Connect unary error body `{code, message}`, checked against the answer's status. */
export function connectError(res: { statusCode: number; body: string }): {
  code: ConnectCode;
  message: string;
} {
  const body = JSON.parse(res.body) as { code: ConnectCode; message: string };
  assert.deepEqual(Object.keys(body).sort(), ['code', 'message'], res.body);
  assert.ok(body.code in CONNECT_STATUS, `${body.code} is a Connect code`);
  const status =
    body.code === 'unavailable' && res.statusCode === 502 ? 502 : CONNECT_STATUS[body.code];
  assert.equal(res.statusCode, status, `${body.code} has its status`);
  return body;
}

/**
 * One enveloped request message of a server-streaming call (`application/connect+json`): the
 * Connect framing is one format both ways, so the front's own encoder writes it.
 */
export { envelope as enveloped } from '../../src/api/e2b/connect.js';

export interface Envelope {
  flags: number;
  msg: Record<string, unknown>;
}

/** A stream's body as its envelopes, checked to be whole envelopes that end with one end-stream. */
export function envelopes(body: Buffer): Envelope[] {
  const out: Envelope[] = [];
  let off = 0;
  while (off + 5 <= body.length) {
    const flags = body.readUInt8(off);
    const length = body.readUInt32BE(off + 1);
    const json = body.subarray(off + 5, off + 5 + length).toString('utf8');
    out.push({ flags, msg: JSON.parse(json) as Record<string, unknown> });
    off += 5 + length;
  }
  assert.equal(off, body.length, 'the body is whole envelopes');
  assert.deepEqual(
    out.map((e) => e.flags),
    [...out.slice(1).map(() => 0), 2],
    'messages, then one end-stream envelope',
  );
  return out;
}

/** A stream's messages and its end (`{}`, or `{error: {code, message}}`). */
export function streamOf(res: Response): {
  messages: Record<string, unknown>[];
  end: { error?: { code: ConnectCode; message: string } };
} {
  assert.equal(res.statusCode, 200, 'a stream is 200, even when it fails');
  assert.equal(res.headers['content-type'], 'application/connect+json');
  const all = envelopes(res.rawPayload);
  const end = all.at(-1)!.msg as { error?: { code: ConnectCode; message: string } };
  if (end.error) assert.deepEqual(Object.keys(end.error).sort(), ['code', 'message']);
  return { messages: all.slice(0, -1).map((e) => e.msg), end };
}

/** `/execute`'s NDJSON lines, checked to end with `end_of_execution`. */
export function ndjsonLines(res: Response): Record<string, unknown>[] {
  assert.equal(res.headers['content-type'], 'application/x-ndjson');
  assert.ok(res.body.endsWith('\n'), 'every line ends with a newline');
  const lines = res.body
    .slice(0, -1)
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(lines.at(-1), { type: 'end_of_execution' });
  return lines;
}

/**
 * The guest paths a data-plane request names (`?path=`, a Connect message's `path`, `source`,
 * `destination`), each also as the home of root and `user` resolve it: its answer may quote them.
 */
function guestPaths(opts: Request): string[] {
  const named = clientValues(opts.url);
  const { payload } = opts;
  const text = Buffer.isBuffer(payload) ? payload.subarray(5).toString() : payload;
  if (typeof text === 'string' && text.startsWith('{')) {
    try {
      const msg = JSON.parse(text) as Record<string, unknown>;
      for (const k of ['path', 'source', 'destination']) {
        if (typeof msg[k] === 'string') named.push(msg[k]);
      }
    } catch {
      // not JSON: names no path
    }
  }
  return named
    .flatMap((p) => (p.startsWith('/') ? [p] : [`/home/user/${p}`, `/root/${p}`, p]))
    .sort((a, b) => b.length - a.length);
}

/** Checks a data-plane answer's shape (see above). */
function checkDataPlane(where: string, opts: Request, res: Response): void {
  const url = opts.url;
  const allowed = guestPaths(opts);
  if (res.statusCode >= 300) {
    if (isConnectPath(url)) {
      assertNoHostDetails(where, connectError(res).message, [], allowed);
      return;
    }
    const body = JSON.parse(res.body) as Record<string, unknown>;
    assert.equal(body.code, res.statusCode, `${where}: the body carries the status`);
    assert.equal(typeof body.message, 'string', where);
    const extra = Object.keys(body).filter((k) => !['code', 'message'].includes(k));
    for (const k of extra) assert.ok(['error_code', 'sandboxId'].includes(k), `${where}: ${k}`);
    if (body.error_code !== undefined) assertRegistryCode(String(body.error_code));
    assertNoHostDetails(where, res.body, [], allowed);
  } else if (res.headers['content-type'] === 'application/connect+json') {
    const { end } = streamOf(res);
    if (end.error) assertNoHostDetails(where, end.error.message, [], allowed);
  } else if (res.headers['content-type'] === 'application/x-ndjson') {
    for (const line of ndjsonLines(res)) {
      if (line.type === 'error') assertNoHostDetails(where, String(line.value), [], allowed);
    }
  }
}

/** The data-plane route (`PLANE METHOD /fastify/:path`) a request names, if any. */
function routeOf(plane: DataPlane, method: string, url: string): string | undefined {
  const path = url.split('?')[0]!;
  return Object.keys(E2B_ROUTE_AREAS).find((route) => {
    const [p, m, pattern] = route.split(' ') as [string, string, string];
    const re = new RegExp(`^${pattern.replace(/:[a-z]+/g, '[^/]+')}$`);
    return p === plane && m === method && re.test(path);
  });
}

/**
 * Gives inject's stand-in socket the two calls the front makes on a real one: `setNoDelay` (the
 * interpreter's stream flushes each line) and `destroy` (a stopped sandbox's connections are
 * cut): no-ops, as an injected request has no connection to tune or cut.
 */
async function socketCalls(app: FastifyInstance): Promise<void> {
  const res = await app.inject({ url: '/' });
  for (const socket of [res.raw.req.socket, res.raw.res.socket]) {
    const proto = Object.getPrototypeOf(socket) as Record<string, unknown>;
    proto.setNoDelay ??= function setNoDelay(this: unknown) {
      return this;
    };
    proto.destroy ??= function destroy(this: unknown) {
      return this;
    };
  }
}

export async function startE2bServer(
  overrides: Partial<ManagerOptions> = {},
  log: Logger = pino({ level: 'silent' }),
): Promise<TestE2bServer> {
  const { manager, hv } = await started(overrides, log);
  const { app } = await buildE2bServer({
    manager,
    auth: { kind: 'keys', keys: [E2B_KEY] },
    tokens: SandboxTokens.ephemeral(),
    maxBodyBytes: 4 * 1024 * 1024,
    maxFileBytes: overrides.maxFileBytes ?? 1024,
    logger: log,
  });
  await socketCalls(app);
  const inject = async (opts: Request): Promise<Response> => {
    const res = await app.inject({ ...opts, headers: { 'x-api-key': E2B_KEY, ...opts.headers } });
    const where = `${opts.method ?? 'GET'} ${opts.url.slice(0, 100)} (${res.statusCode})`;
    if (res.statusCode >= 300) {
      e2bErrorBody(res);
      assertNoHostDetails(where, res.body, [], clientValues(opts.url));
    }
    return res;
  };
  const dataPlane =
    (plane: DataPlane, port: string) =>
    async (sandbox: E2bSandbox, opts: Request): Promise<Response> => {
      const headers: Record<string, unknown> = {
        'e2b-sandbox-id': sandbox.id,
        'e2b-sandbox-port': port,
        'x-access-token': sandbox.accessToken,
        ...opts.headers,
      };
      for (const [k, v] of Object.entries(headers)) if (v === undefined) delete headers[k];
      const method = opts.method ?? 'GET';
      const route = routeOf(plane, method, opts.url);
      if (route !== undefined) recordRoute(route);
      const res = await app.inject({ ...opts, headers: headers as Record<string, string> });
      checkDataPlane(`${plane} ${method} ${opts.url.slice(0, 100)} (${res.statusCode})`, opts, res);
      return res;
    };
  return {
    app,
    manager,
    hv,
    inject,
    async sandbox(body = {}) {
      const res = await inject({
        method: 'POST',
        url: '/v2/sandboxes',
        payload: { templateID: 'base', ...body },
      });
      assert.equal(res.statusCode, 201, res.body);
      const made = JSON.parse(res.body) as Record<string, string>;
      return {
        id: made.sandboxID!,
        accessToken: made.envdAccessToken!,
        trafficToken: made.trafficAccessToken!,
      };
    },
    envd: dataPlane('envd', ENVD),
    interpreter: dataPlane('interpreter', INTERPRETER),
    async close() {
      await app.close();
      await manager.shutdown();
    },
  };
}

/**
 * The data-plane routes the front registers (`PLANE METHOD /fastify/:path`, HEAD left out), as
 * server.ts registers them in its envd and interpreter scopes: what E2B_ROUTE_AREAS must hold.
 */
export async function registeredDataPlaneRoutes(): Promise<string[]> {
  const { manager } = setup();
  const tokens = SandboxTokens.ephemeral();
  const ctx = makeContext({
    manager,
    log: pino({ level: 'silent' }),
    tokens,
    maxBodyBytes: 1024,
    maxFileBytes: 1024,
    resolved: new WeakMap(),
    stopWatch: new StopWatch(manager),
  });
  const routes: string[] = [];
  const scope = async (plane: DataPlane, register: (app: FastifyInstance) => void) => {
    const app = Fastify();
    app.addHook('onRoute', (route) => {
      for (const method of [route.method].flat()) {
        if (method !== 'HEAD') routes.push(`${plane} ${method} ${route.url}`);
      }
    });
    register(app);
    await app.ready();
    await app.close();
  };
  await scope('envd', (app) => {
    registerHealthRoute(app, ctx);
    registerEnvdRoutes(app, ctx);
  });
  await scope('interpreter', (app) => registerInterpreterRoutes(app, ctx));
  return routes.sort();
}
