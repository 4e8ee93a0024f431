/** Snapshots: a sandbox's whole state kept on disk, to create sandboxes from. */
import type { FastifyInstance } from 'fastify';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import type { ClusterFront } from '../cluster-front.js';
import { parseNoBody, parseSnapshot } from '../validate.js';

type IdParams = { id: string };

export function registerSnapshotRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  front?: ClusterFront,
): void {
  app.post<{ Params: IdParams }>('/v1/sandboxes/:id/snapshot', async (req) =>
    manager.snapshot(req.params.id, parseSnapshot(req.body).name),
  );

  app.get('/v1/snapshots', async (req) => {
    const local = manager.listSnapshots();
    const all = front ? await front.gather(req, 'snapshots', local) : local;
    // A snapshot copied to several nodes is listed once, with the sandboxes using it on each.
    const once = new Map<string, (typeof all)[number]>();
    for (const s of all) {
      const seen = once.get(s.snapshot_id);
      once.set(s.snapshot_id, seen ? { ...seen, sandboxes: seen.sandboxes + s.sandboxes } : s);
    }
    // Newest first across nodes, as on one.
    return {
      snapshots: [...once.values()].sort((a, b) => b.created_at.localeCompare(a.created_at)),
    };
  });

  app.get<{ Params: IdParams }>('/v1/snapshots/:id', async (req) =>
    manager.describeSnapshot(req.params.id),
  );

  app.delete<{ Params: IdParams }>('/v1/snapshots/:id', async (req, reply) => {
    parseNoBody(req.body, 'delete');
    manager.deleteSnapshot(req.params.id);
    return reply.code(204).send();
  });
}
