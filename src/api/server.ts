/**
 * The HTTP server: body parsing, authentication, error rendering and the routes (one module
 * per concept in api/routes/). Every non-2xx response is `{"error", "code"}` from the error
 * registry, including fastify's own failures (bad JSON, body too large, unknown route).
 */
import { maxHeaderSize } from 'node:http';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import type { Logger } from 'pino';
import { HostdError, fail, isError } from '../errors.js';
import type { SandboxManager } from '../core/sandbox-manager.js';
import { makeAuthChecker, type AuthMode } from './auth.js';
import {
  answerClientError,
  classifyFrameworkError,
  escapeBadPercents,
  parseJsonBody,
} from './http-errors.js';
import { lazyChildLoggerFactory } from './lazy-logger.js';
import type { Metrics } from './metrics.js';
import { ClusterFront } from './cluster-front.js';
import { registerClusterRoutes, type ClusterRoutes } from './routes/cluster.js';
import { registerConsoleRoutes } from './routes/console.js';
import { registerContextRoutes } from './routes/contexts.js';
import { registerExecRoutes } from './routes/exec.js';
import { rawBodyParser, registerFileRoutes, UPLOAD_ROUTE } from './routes/files.js';
import { registerLineageRoutes } from './routes/lineage.js';
import { MCP_ROUTE, registerMcpRoutes, type McpRouteOptions } from './routes/mcp.js';
import { registerSandboxRoutes } from './routes/sandboxes.js';
import { registerServiceRoutes } from './routes/service.js';
import { registerSnapshotRoutes } from './routes/snapshots.js';
import { registerTemplateRoutes } from './routes/templates.js';
import { lazySchemaCompilers } from './schema-compilers.js';

export interface ServerOptions {
  manager: SandboxManager;
  auth: AuthMode;
  maxBodyBytes: number;
  /** SERVICE_MAX_FILE_BYTES: the only bound on a file upload's body. */
  maxFileBytes: number;
  logger: Logger;
  metrics: Metrics;
  /** The MCP endpoint's session handling (SERVICE_MCP_*); defaults when absent. */
  mcp?: Omit<McpRouteOptions, 'logger'>;
  /** Cluster mode: this node, and how its drain starts; absent for a single hostd. */
  cluster?: ClusterRoutes;
}

/** `{"error", "code"}` with the entry's status, and `Retry-After` when a retry can work. */
export function sendError(reply: FastifyReply, err: HostdError): FastifyReply {
  if (err.retryAfterS !== undefined) void reply.header('retry-after', String(err.retryAfterS));
  return reply.code(err.status).type('application/json').send(err.toBody());
}

/**
 * Answers before the body was read. The connection is kept open and the body drained and
 * discarded: closing a socket with unread data makes TCP reset it, which can destroy the error
 * response before the client reads it. A client that keeps sending is cut off after 30 s.
 */
function rejectBeforeBody(req: FastifyRequest, reply: FastifyReply, err: HostdError): FastifyReply {
  req.raw.resume();
  const cutOff = setTimeout(() => req.raw.destroy(), 30_000).unref();
  req.raw.once('end', () => clearTimeout(cutOff));
  return sendError(reply, err);
}

export async function buildServer(opts: ServerOptions): Promise<FastifyInstance> {
  const { manager } = opts;
  const app = Fastify({
    loggerInstance: opts.logger as unknown as FastifyBaseLogger,
    schemaController: lazySchemaCompilers,
    bodyLimit: opts.maxBodyBytes,
    // One log line per request would drown the sandbox lifecycle logs at exec rates.
    logController: new LogController({ disableRequestLogging: true }),
    // req.log is made when something logs through it, not for every request (lazy-logger.ts).
    childLoggerFactory: lazyChildLoggerFactory,
    // Ids are validated by the manager, which answers a malformed one as not found: the
    // router takes any segment that fits in a request line, and any percent-escape.
    routerOptions: { maxParamLength: maxHeaderSize },
    rewriteUrl: (req) => escapeBadPercents(req.url ?? '/'),
    frameworkErrors: (error, req, reply) =>
      sendError(reply, classifyFrameworkError(error, opts.maxBodyBytes, req.id)),
    clientErrorHandler: answerClientError,
    return503OnClosing: false,
    // On shutdown, close exec streams whose clients stopped reading instead of waiting forever.
    forceCloseConnections: true,
  });

  // JSON bodies; an empty body is "no body" (POST /v1/sandboxes with nothing is `{}`).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, raw, done) => {
    let body: unknown;
    try {
      body = parseJsonBody(raw as string);
    } catch (err) {
      return done(err as HostdError, undefined);
    }
    done(null, body);
  });

  const checkAuth = makeAuthChecker(opts.auth);
  // Auth is decided on the route that matched, never on the raw URL: the router decodes
  // percent-escapes, so "/%761/sandboxes" reaches /v1/sandboxes and must be guarded like it.
  app.addHook('onRequest', async (req, reply) => {
    const route = req.routeOptions.url;
    if (route === undefined) return; // no route: a 404 reveals nothing
    const guarded =
      (route.startsWith('/v1/') && route !== '/v1/healthz') ||
      route === '/metrics' ||
      route === MCP_ROUTE;
    const err = guarded ? checkAuth(req.headers.authorization) : null;
    if (err) return rejectBeforeBody(req, reply, err);
    const declared = Number(req.headers['content-length'] ?? 0);
    if (route === UPLOAD_ROUTE && req.method === 'PUT') {
      // Uploads stream to the guest; only SERVICE_MAX_FILE_BYTES bounds them.
      if (declared > opts.maxFileBytes) {
        return rejectBeforeBody(req, reply, fail('fileTooLarge', opts.maxFileBytes));
      }
    } else if (declared > opts.maxBodyBytes) {
      return rejectBeforeBody(req, reply, fail('bodyTooLarge', declared, opts.maxBodyBytes));
    }
  });

  app.setErrorHandler((error, req, reply) => {
    const err = classifyFrameworkError(
      error as Error & { statusCode?: number },
      opts.maxBodyBytes,
      req.id,
    );
    if (isError(err, 'internal')) req.log.error({ err: error, reqId: req.id }, 'internal error');
    return sendError(reply, err);
  });
  app.setNotFoundHandler((req, reply) =>
    sendError(reply, fail('routeNotFound', req.method, req.url.split('?')[0] ?? '')),
  );

  // After authentication (the hook above): a forwarded request was checked here and is again
  // by the node that answers it.
  const peer = opts.cluster?.peer;
  const front = opts.cluster
    ? new ClusterFront(
        opts.cluster.node,
        peer
          ? {
              pausedWithoutRoom: (id) => peer.manager.pausedWithoutRoom(id),
              moveToRoom: (id, template) => peer.handOver.moveToRoom(id, template),
            }
          : null,
      )
    : undefined;
  front?.install(app);
  app.addHook('onClose', async () => front?.close());

  registerServiceRoutes(app, opts.metrics);
  registerClusterRoutes(app, opts.cluster ?? null);
  registerSandboxRoutes(app, manager, front);
  registerExecRoutes(app, manager);
  registerContextRoutes(app, manager);
  registerLineageRoutes(app, manager);
  registerSnapshotRoutes(app, manager, front);
  registerTemplateRoutes(app, manager);
  await registerConsoleRoutes(app);
  registerMcpRoutes(app, {
    sessionEnd: opts.mcp?.sessionEnd ?? 'delete',
    idleTimeoutS: opts.mcp?.idleTimeoutS ?? 3600,
    logger: opts.logger,
  });
  // In their own scope: only these routes take raw bodies.
  await app.register(async (scope) => {
    rawBodyParser(scope);
    registerFileRoutes(scope, manager);
  });

  return app;
}
