/** Sandboxes themselves: create, list, describe, logs, delete, pause and resume. */
import type { FastifyInstance } from 'fastify';
import { validateAllowOut, type SandboxManager } from '../../core/sandbox-manager.js';
import { ClusterFront } from '../cluster-front.js';
import { compileCreateCheck, parseCreate, parseNoBody, parseSetTimeout } from '../validate.js';

type IdParams = { id: string };

export function registerSandboxRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  front?: ClusterFront,
): void {
  compileCreateCheck();
  app.post('/v1/sandboxes', async (req, reply) => {
    const { network, ...rest } = parseCreate(req.body);
    const allowOut = network ? validateAllowOut(network.allow_out) : undefined;
    const here = async (): Promise<unknown> => {
      const sandbox = await manager.create({ ...rest, ...(allowOut ? { allowOut } : {}) });
      return { id: sandbox.id, state: 'ready' };
    };
    // Cluster mode: placed on the least loaded node (maybe this one).
    return front ? front.create(req, reply, rest, here) : here();
  });

  app.get('/v1/sandboxes', async (req) => {
    if (!front) return { sandboxes: manager.list() };
    const all = await front.gather(req, 'sandboxes', manager.list());
    // Nodes that are down list nothing: their sandboxes come from the catalog.
    const stranded = ClusterFront.forwarded(req) ? [] : front.node.strandedSandboxes();
    return { sandboxes: [...all, ...stranded] };
  });

  app.get<{ Params: IdParams }>('/v1/sandboxes/:id', async (req) =>
    manager.describe(req.params.id),
  );

  // The VM's console and QEMU log tail: what a user needs when a guest misbehaves.
  app.get<{ Params: IdParams }>('/v1/sandboxes/:id/logs', async (req, reply) =>
    reply.type('text/plain; charset=utf-8').send(await manager.logTail(req.params.id)),
  );

  app.delete<{ Params: IdParams }>('/v1/sandboxes/:id', async (req, reply) => {
    parseNoBody(req.body, 'delete');
    await manager.delete(req.params.id);
    return reply.code(204).send();
  });

  // Its lifetime (docs/api.md, Metadata and lifetime): seconds of running time from now.
  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/timeout', async (req) => {
    const { timeoutS, onTimeout } = parseSetTimeout(req.body);
    return manager.setTimeout(req.params.id, timeoutS, onTimeout ? { onTimeout } : {});
  });

  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/pause', async (req) => {
    parseNoBody(req.body, 'pause');
    const { id, state } = await manager.pause(req.params.id);
    return { id, state };
  });

  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/resume', async (req) => {
    parseNoBody(req.body, 'resume');
    const { id, state } = await manager.resume(req.params.id);
    return { id, state };
  });
}
