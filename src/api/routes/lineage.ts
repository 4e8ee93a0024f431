/** Fork and merge: sandboxes made from, and rebound to, other sandboxes' state. */
import type { FastifyInstance } from 'fastify';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { parseFork, parseNoBody } from '../validate.js';

export function registerLineageRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.post<{ Params: { id: string } }>('/v1/sandboxes/:id/fork', async (req) => {
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
      parseNoBody(req.body, 'merge');
      const info = await manager.merge(req.params.parent, req.params.winner);
      return { id: info.id, state: 'ready', merged: req.params.winner };
    },
  );
}
