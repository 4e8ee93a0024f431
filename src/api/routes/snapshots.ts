/** Snapshots: a sandbox's whole state kept on disk, to create sandboxes from. */
import type { FastifyInstance } from 'fastify';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { parseNoBody, parseSnapshot } from '../validate.js';

type IdParams = { id: string };

export function registerSnapshotRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/snapshot', async (req) =>
    manager.snapshot(req.params.id, parseSnapshot(req.body).name),
  );

  app.get('/v1/snapshots', async () => ({ snapshots: manager.listSnapshots() }));

  app.get<{ Params: IdParams }>('/v1/snapshots/:id', async (req) =>
    manager.describeSnapshot(req.params.id),
  );

  app.delete<{ Params: IdParams }>('/v1/snapshots/:id', async (req, reply) => {
    parseNoBody(req.body, 'delete');
    manager.deleteSnapshot(req.params.id);
    return reply.code(204).send();
  });
}
