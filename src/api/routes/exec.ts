/** Exec: running code in a sandbox, its output streamed as NDJSON events. */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ExecRun } from '../../core/exec-run.js';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { parseExec } from '../validate.js';

export function registerExecRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.post<{ Params: { id: string } }>('/v1/sandboxes/:id/exec', async (req, reply) => {
    const body = parseExec(req.body);
    const abort = new AbortController();
    // 'close' on the response fires when the client goes away (or when we finish).
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) abort.abort();
    });
    const run = await manager.exec(req.params.id, { ...body, signal: abort.signal });
    // A context the sandbox lacks is a 404 before the stream: wait for the guest to take it
    if (body.context !== undefined) await run.started;
    await streamExec(req, reply, run);
  });
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
  // (Optional: the socket of fastify's `inject()`, which tests use, has no such method.)
  res.socket?.setNoDelay?.(true);
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
