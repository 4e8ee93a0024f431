/**
 * The E2B-compatible front (docs/e2b.md): its own fastify instance on its own port
 * (SERVICE_E2B_ADDR), so that one bare origin serves both `E2B_API_URL` and `E2B_SANDBOX_URL`
 * (the SDKs' signed file URLs drop any path, so the sandbox URL must be an origin).
 *
 * Each request is dispatched by kind before its route is chosen, through a fastify route
 * constraint on `E2b-Sandbox-Port`: 49983 is envd (envd.ts, health.ts), 49999 the code
 * interpreter (interpreter.ts), no header the control plane (control.ts) — except `/files`
 * without the header, which is envd's: uploadUrl()/downloadUrl() URLs are fetched with no
 * header at all. Each kind is a fastify scope with its own body parsers, its own auth and its
 * own error shape; a route registered in a scope serves only that kind.
 *
 * Data-plane requests are looked up and authorized before their route runs: a sandbox that is
 * not running answers 502 as E2B's proxy does, a wrong token 401, and while the request is in
 * flight its connection is cut if the sandbox stops (killed, expired, paused), so that the
 * SDKs' "killed while the request was in flight" detection fires.
 */
import type { IncomingMessage } from 'node:http';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import type { Logger } from 'pino';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { fail, isError, toHostdError, type HostdError } from '../../errors.js';
import type { AuthMode } from '../auth.js';
import { makeApiKeyChecker, SandboxTokens } from './auth.js';
import {
  ENVD_PORT,
  INTERPRETER_PORT,
  makeContext,
  StopWatch,
  type DataPlaneSandbox,
  type E2bContext,
  type TokenPolicy,
} from './context.js';
import type { ClusterNode } from '../../core/cluster/cluster-node.js';
import { ClusterFront, type RoomMover } from '../cluster-front.js';
import { installE2bHop } from './cluster-hop.js';
import { registerControlRoutes } from './control.js';
import { registerEnvdRoutes } from './envd.js';
import { signedSandboxId } from './envd-files.js';
import { classifyFrameworkError, isConnectPath, sendConnectError, sendE2bError } from './errors.js';
import { registerHealthRoute } from './health.js';
import { registerInterpreterRoutes } from './interpreter.js';
import { lazySchemaCompilers } from '../schema-compilers.js';

export interface E2bServerOptions {
  manager: SandboxManager;
  auth: AuthMode;
  tokens: SandboxTokens;
  maxBodyBytes: number;
  maxFileBytes: number;
  logger: Logger;
  /** Cluster mode: this node; requests for other nodes' sandboxes are forwarded there. */
  cluster?: ClusterNode;
  /**
   * Cluster mode with hand-overs: moves a paused sandbox this node has no room to resume to a
   * node with room before E2B's `connect` resumes it (as the native API's resumes do).
   */
  room?: RoomMover;
}

/** The kinds of E2B traffic, as the route constraint names them. */
type Kind = 'control' | typeof ENVD_KIND | typeof INTERPRETER_KIND;
const ENVD_KIND = String(ENVD_PORT);
const INTERPRETER_KIND = String(INTERPRETER_PORT);
const CONSTRAINT = 'e2bPort';

function header(req: { headers: IncomingMessage['headers'] }, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** Which kind a request is (or the unknown port it names). */
function kindOf(req: IncomingMessage): string {
  const port = header(req, 'e2b-sandbox-port');
  if (port !== undefined) return port.trim();
  const path = (req.url ?? '').split('?')[0];
  return path === '/files' ? ENVD_KIND : 'control';
}

/** Routes by kind; a request of a kind no route serves finds no route (the not-found handler). */
function kindConstraint(): Parameters<FastifyInstance['addConstraintStrategy']>[0] {
  return {
    name: CONSTRAINT,
    mustMatchWhenDerived: true,
    storage() {
      const handlers = new Map<unknown, unknown>();
      return {
        get: (value: unknown) => (handlers.get(value) ?? null) as never,
        set: (value: unknown, handler: unknown) => void handlers.set(value, handler),
      };
    },
    deriveConstraint: (req: IncomingMessage) => kindOf(req),
  } as unknown as Parameters<FastifyInstance['addConstraintStrategy']>[0];
}

/** JSON, with an empty body as no body (the SDKs send JSON content types on GET and DELETE). */
function jsonParser(scope: FastifyInstance): void {
  scope.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, raw, done) => {
    const text = (raw as string).trim();
    if (text === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(fail('bodyNotJson', (err as Error).message), undefined);
    }
  });
}

/** Answers before the body was read; the body is drained so the answer is not reset away. */
function drain(req: FastifyRequest): void {
  req.raw.resume();
  const cutOff = setTimeout(() => req.raw.destroy(), 30_000).unref();
  req.raw.once('end', () => clearTimeout(cutOff));
}

export async function buildE2bServer(
  opts: E2bServerOptions,
): Promise<{ app: FastifyInstance; ctx: E2bContext }> {
  const { manager, tokens } = opts;
  const app = Fastify({
    loggerInstance: opts.logger.child({ front: 'e2b' }) as unknown as FastifyBaseLogger,
    schemaController: lazySchemaCompilers,
    bodyLimit: opts.maxBodyBytes,
    logController: new LogController({ disableRequestLogging: true }),
    routerOptions: { maxParamLength: 200 },
    return503OnClosing: false,
    forceCloseConnections: true,
  });
  app.addConstraintStrategy(kindConstraint());
  app.removeAllContentTypeParsers();

  const resolved = new WeakMap<object, DataPlaneSandbox | null>();
  const stopWatch = new StopWatch(manager);
  const front = opts.cluster ? new ClusterFront(opts.cluster, opts.room ?? null) : null;
  const ctx = makeContext({
    cluster: front,
    manager,
    log: opts.logger,
    tokens,
    maxBodyBytes: opts.maxBodyBytes,
    maxFileBytes: opts.maxFileBytes,
    resolved,
    stopWatch,
  });

  const renderFor = (kind: string, req: FastifyRequest, reply: FastifyReply, err: HostdError) =>
    kind === ENVD_KIND && isConnectPath(req.url)
      ? sendConnectError(reply, err)
      : sendE2bError(reply, err);

  /** A scope serving one kind: every route in it is constrained to that kind. */
  const scopeOf =
    (kind: Kind, setup: (scope: FastifyInstance) => void) =>
    async (scope: FastifyInstance): Promise<void> => {
      scope.addHook('onRoute', (route) => {
        route.constraints = { ...route.constraints, [CONSTRAINT]: kind };
      });
      scope.setErrorHandler((error, req, reply) => {
        const err = classifyFrameworkError(error as Error, opts.maxBodyBytes, req.id);
        if (isError(err, 'internal')) req.log.error({ err: error }, 'internal error');
        return renderFor(kind, req, reply, err);
      });
      setup(scope);
    };

  // The control plane: X-API-KEY on every route.
  const checkKey = makeApiKeyChecker(opts.auth);

  // Cluster mode: first of all, a request for another node's sandbox goes there.
  if (front) {
    installE2bHop(app, front, {
      kindOf: (req) => (kindOf(req.raw) === 'control' ? 'control' : 'data'),
      checkKey: (req) => checkKey(req.headers['x-api-key']),
      isConnect: (req) => isConnectPath(req.url),
      sendError: (req, reply, err) => renderFor(kindOf(req.raw), req, reply, err),
      drain,
      signedSandboxId: (req, operation) => signedSandboxId(ctx, req, operation),
      trafficMoves: (req, id) => {
        const kind = kindOf(req.raw);
        if (kind !== ENVD_KIND && kind !== INTERPRETER_KIND) return false;
        try {
          ctx.requireRunning(id);
        } catch {
          return false; // answered here: E2B's 502, moving nothing
        }
        const policy =
          req.routeOptions.config.e2bToken ?? (kind === ENVD_KIND ? 'access' : 'traffic');
        // The token the route would check, as dataPlaneHook does; `none` (health) moves nothing.
        const access = header(req, 'x-access-token');
        if (policy === 'access' || policy === 'access-or-signature') {
          return tokens.isClusterToken(id, access, ['access']);
        }
        if (policy !== 'traffic') return false;
        const both = ['access', 'traffic'] as const;
        return (
          tokens.isClusterToken(id, access, both) ||
          tokens.isClusterToken(id, header(req, 'e2b-traffic-access-token'), both)
        );
      },
    });
  }
  await app.register(
    scopeOf('control', (scope) => {
      jsonParser(scope);
      scope.addHook('onRequest', async (req, reply) => {
        const err = checkKey(req.headers['x-api-key']);
        if (err) {
          drain(req);
          return sendE2bError(reply, err);
        }
      });
      registerControlRoutes(scope, ctx);
    }),
  );

  /** Looks up and authorizes a data-plane request's sandbox (context.ts, TokenPolicy). */
  const dataPlaneHook =
    (kind: Kind, fallback: TokenPolicy) =>
    async (req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> => {
      try {
        const policy = req.routeOptions.config.e2bToken ?? fallback;
        const id = header(req, 'e2b-sandbox-id');
        if (id === undefined || id === '') {
          if (policy === 'access-or-signature') {
            resolved.set(req.raw, null);
            return;
          }
          throw fail('sandboxNotRunning', '');
        }
        ctx.requireRunning(id);
        const access = header(req, 'x-access-token');
        let tokenChecked = true;
        if (policy === 'access') {
          if (!tokens.isAccessToken(id, access)) throw fail('invalidAccessToken');
        } else if (policy === 'traffic') {
          const traffic = header(req, 'e2b-traffic-access-token');
          const ok = tokens.isTrafficToken(id, access) || tokens.isTrafficToken(id, traffic);
          if (!ok) throw fail('invalidAccessToken');
        } else if (policy === 'access-or-signature') {
          if (access !== undefined && !tokens.isAccessToken(id, access)) {
            throw fail('invalidAccessToken');
          }
          tokenChecked = access !== undefined;
        }
        resolved.set(req.raw, { id, accessTokens: tokens.accessTokens(id), tokenChecked });
        const unwatch = stopWatch.watch(id, req.raw.socket);
        reply.raw.once('close', unwatch);
      } catch (err) {
        drain(req);
        return renderFor(kind, req, reply, toHostdError(err, req.id));
      }
    };

  await app.register(
    scopeOf(ENVD_KIND, (scope) => {
      jsonParser(scope);
      scope.addContentTypeParser(
        'application/connect+json',
        { parseAs: 'buffer' },
        (_req, body, done) => done(null, body),
      );
      // Uploads (multipart, octet-stream) stream: the request itself is the body.
      scope.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
      scope.addHook('onRequest', dataPlaneHook(ENVD_KIND, 'access'));
      registerHealthRoute(scope, ctx);
      registerEnvdRoutes(scope, ctx);
    }),
  );

  await app.register(
    scopeOf(INTERPRETER_KIND, (scope) => {
      jsonParser(scope);
      scope.addHook('onRequest', dataPlaneHook(INTERPRETER_KIND, 'traffic'));
      registerInterpreterRoutes(scope, ctx);
    }),
  );

  // No route: on the data plane a sandbox that is not running is still E2B's 502 first.
  app.setNotFoundHandler((req, reply) => {
    const kind = kindOf(req.raw);
    drain(req);
    const path = req.url.split('?')[0] ?? '';
    if (kind === 'control') return sendE2bError(reply, fail('routeNotFound', req.method, path));
    try {
      ctx.requireRunning(header(req, 'e2b-sandbox-id') ?? '');
    } catch (err) {
      return renderFor(kind, req, reply, toHostdError(err, req.id));
    }
    const err =
      kind === ENVD_KIND || kind === INTERPRETER_KIND
        ? fail('routeNotFound', req.method, path)
        : fail(
            'notSupported',
            `port ${kind}`,
            `E2B_SANDBOX_URL serves envd (${ENVD_PORT}) and the code interpreter (${INTERPRETER_PORT}) only`,
          );
    return renderFor(kind, req, reply, err);
  });

  return { app, ctx };
}
