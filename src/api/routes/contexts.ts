/** REPL contexts: independent Python states in one sandbox (docs/api.md, Contexts). */
import type { FastifyInstance } from 'fastify';
import { fail } from '../../errors.js';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { CONTEXT_ID, parseContextCreate, parseNoBody } from '../validate.js';
import { clientGone } from './files.js';

type IdParams = { id: string };
type ContextParams = { id: string; context: string };

/** A context id that cannot exist is simply not found, as a malformed sandbox id is. */
function contextId(params: ContextParams): string {
  if (!CONTEXT_ID.test(params.context)) throw fail('contextNotFound', params.id, params.context);
  return params.context;
}

export function registerContextRoutes(app: FastifyInstance, manager: SandboxManager): void {
  // Each waits for the sandbox's turn like an exec; a client that leaves meanwhile leaves the queue
  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/contexts', async (req, reply) =>
    manager.contexts.create(req.params.id, parseContextCreate(req.body), clientGone(reply)),
  );

  app.get<{ Params: IdParams }>('/v1/sandboxes/:id/contexts', async (req, reply) => ({
    contexts: await manager.contexts.list(req.params.id, clientGone(reply)),
  }));

  app.delete<{ Params: ContextParams }>(
    '/v1/sandboxes/:id/contexts/:context',
    async (req, reply) => {
      parseNoBody(req.body, 'delete');
      await manager.contexts.delete(req.params.id, contextId(req.params), clientGone(reply));
      return reply.code(204).send();
    },
  );

  app.post<{ Params: ContextParams }>(
    '/v1/sandboxes/:id/contexts/:context/restart',
    async (req, reply) => {
      parseNoBody(req.body, 'restart');
      return manager.contexts.restart(req.params.id, contextId(req.params), clientGone(reply));
    },
  );
}
