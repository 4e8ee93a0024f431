/**
 * The HTTP surface: fastify routes that parse and validate requests, call the SandboxManager,
 * and render results. Every non-2xx response is `{"error": message}`, including fastify's own
 * failures (bad JSON, body too large, unknown route), mapped through the error registry.
 */
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import type { Logger } from 'pino';
import { HostdError, fail, isError, toHostdError } from '../errors.js';
import type { SandboxManager } from '../core/sandbox-manager.js';
import type { ExecRun } from '../core/exec-run.js';
import { makeAuthChecker, type AuthMode } from './auth.js';
import type { Metrics } from './metrics.js';
import { parseCreate, parseExec, parseFork } from './validate.js';

export interface ServerOptions {
  manager: SandboxManager;
  auth: AuthMode;
  maxBodyBytes: number;
  logger: Logger;
  metrics: Metrics;
}

type IdParams = { id: string };

/** Fastify's own error codes that are the client's fault, mapped onto registry kinds. */
function classifyFrameworkError(
  err: { statusCode?: number; code?: string; message: string },
  maxBody: number,
): HostdError {
  if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return fail('bodyTooLarge', null, maxBody);
  if (err.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
    return fail('unsupportedMediaType', 'application/json');
  }
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500) {
    return fail('malformedRequest', err.message);
  }
  return toHostdError(err);
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
    bodyLimit: opts.maxBodyBytes,
    // One log line per request would drown the sandbox lifecycle logs at exec rates.
    logController: new LogController({ disableRequestLogging: true }),
    // Sandbox ids are validated by the manager; this only stops absurd URLs early.
    routerOptions: { maxParamLength: 200 },
    return503OnClosing: false,
    // On shutdown, close exec streams whose clients stopped reading instead of waiting forever.
    forceCloseConnections: true,
  });

  // JSON bodies; an empty body is "no body" (POST /v1/sandboxes with nothing is `{}`).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, raw, done) => {
    const text = (raw as string).trim();
    if (text === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(fail('bodyNotJson', (err as Error).message), undefined);
    }
  });

  const checkAuth = makeAuthChecker(opts.auth);
  // Auth is decided on the route that matched, never on the raw URL: the router decodes
  // percent-escapes, so "/%761/sandboxes" reaches /v1/sandboxes and must be guarded like it.
  app.addHook('onRequest', async (req, reply) => {
    const route = req.routeOptions.url;
    if (route === undefined) return; // no route: a 404 reveals nothing
    const guarded = (route.startsWith('/v1/') && route !== '/v1/healthz') || route === '/metrics';
    const err = guarded ? checkAuth(req.headers.authorization) : null;
    if (err) return rejectBeforeBody(req, reply, err);
    const declared = Number(req.headers['content-length'] ?? 0);
    if (declared > opts.maxBodyBytes) {
      return rejectBeforeBody(req, reply, fail('bodyTooLarge', declared, opts.maxBodyBytes));
    }
  });

  app.setErrorHandler((error, req, reply) => {
    const err =
      error instanceof HostdError
        ? error
        : classifyFrameworkError(error as Error & { statusCode?: number }, opts.maxBodyBytes);
    if (isError(err, 'internal')) req.log.error({ err: error }, 'internal error');
    return sendError(reply, err);
  });
  app.setNotFoundHandler((req, reply) =>
    sendError(reply, fail('routeNotFound', req.method, req.url.split('?')[0] ?? '')),
  );

  app.get('/v1/healthz', async (_req, reply) => reply.type('text/plain').send('ok'));

  app.get('/metrics', async (_req, reply) =>
    reply.type(opts.metrics.registry.contentType).send(await opts.metrics.registry.metrics()),
  );

  app.post('/v1/sandboxes', async (req) => {
    const { template } = parseCreate(req.body);
    const sandbox = await manager.create(template);
    return { id: sandbox.id, state: 'ready' };
  });

  app.get('/v1/sandboxes', async () => ({ sandboxes: manager.list() }));

  app.get<{ Params: IdParams }>('/v1/sandboxes/:id', async (req) =>
    manager.describe(req.params.id),
  );

  // The VM's console and QEMU log tail: what a user needs when a guest misbehaves.
  app.get<{ Params: IdParams }>('/v1/sandboxes/:id/logs', async (req, reply) =>
    reply.type('text/plain; charset=utf-8').send(await manager.logTail(req.params.id)),
  );

  app.delete<{ Params: IdParams }>('/v1/sandboxes/:id', async (req, reply) => {
    if (req.body !== undefined) throw fail('bodyNotAllowed', 'delete');
    await manager.delete(req.params.id);
    return reply.code(204).send();
  });

  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/exec', async (req, reply) => {
    const body = parseExec(req.body);
    const abort = new AbortController();
    // 'close' on the response fires when the client goes away (or when we finish).
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) abort.abort();
    });
    const run = await manager.exec(req.params.id, { ...body, signal: abort.signal });
    await streamExec(req, reply, run);
  });

  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/fork', async (req) => {
    const { n } = parseFork(req.body);
    const children = await manager.fork(req.params.id, n);
    return {
      parent_id: req.params.id,
      children: children.map((c) => ({ id: c.id, state: 'ready' })),
    };
  });

  app.post<{ Params: { parent: string; winner: string } }>(
    '/v1/sandboxes/:parent/merge_into/:winner',
    async (req) => {
      if (req.body !== undefined) throw fail('bodyNotAllowed', 'merge');
      const info = await manager.merge(req.params.parent, req.params.winner);
      return { id: info.id, state: 'ready', merged: req.params.winner };
    },
  );

  return app;
}

/** How long a running exec with no event yet may hold back its status and headers. */
const HEADERS_AFTER_MS = 20;

/**
 * Writes exec events as NDJSON, flushed as produced, and waits for 'drain' when the client
 * reads slowly: that wait is what pauses the VM's output. Events that arrive in the same turn
 * of the event loop (a quick exec's output and exit come in one read) leave in one write, with
 * the headers and the end of the response: one wake-up of the client instead of three.
 */
async function streamExec(req: FastifyRequest, reply: FastifyReply, run: ExecRun): Promise<void> {
  reply.hijack();
  const res = reply.raw;
  res.socket?.setNoDelay(true);
  res.writeHead(200, {
    'content-type': 'application/x-ndjson',
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
  });
  // A quick exec's headers leave with its events; a silent one's after HEADERS_AFTER_MS, so
  // that its client knows it runs (it is no longer queued).
  const headers = setTimeout(() => res.flushHeaders(), HEADERS_AFTER_MS);
  let corked = false;
  const uncork = (): void => {
    corked = false;
    res.uncork();
  };
  try {
    for await (const event of run) {
      clearTimeout(headers);
      if (res.destroyed) break;
      if (!corked) {
        corked = true;
        res.cork();
        setImmediate(uncork);
      }
      if (!res.write(JSON.stringify(event) + '\n')) {
        await new Promise<void>((resolve) => {
          const done = (): void => {
            res.off('drain', done);
            res.off('close', done);
            resolve();
          };
          res.on('drain', done);
          res.on('close', done);
        });
      }
    }
  } catch (err) {
    req.log.error({ err }, 'exec stream failed');
  } finally {
    clearTimeout(headers);
    run.discard();
    if (!res.destroyed) res.end();
  }
}
