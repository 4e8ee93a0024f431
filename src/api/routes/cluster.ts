/** Cluster mode: the nodes and their state, and draining one (docs/api.md, Cluster). */
import type { FastifyInstance } from 'fastify';
import type { ClusterNode } from '../../core/cluster/cluster-node.js';
import { fail } from '../../errors.js';
import { parseNoBody } from '../validate.js';

/** What the drain route starts: hand every sandbox to other nodes, take no creates. */
export type DrainStarter = () => void;

export function registerClusterRoutes(
  app: FastifyInstance,
  cluster: { node: ClusterNode; drain: DrainStarter } | null,
): void {
  app.get('/v1/cluster', async () => {
    if (!cluster) return { enabled: false, node: null, etcd: null, nodes: [] };
    return cluster.node.info();
  });

  // Another node's drain is forwarded to it (api/cluster-front.ts): this one drains itself.
  app.post<{ Params: { id: string } }>('/v1/cluster/nodes/:id/drain', async (req, reply) => {
    parseNoBody(req.body, 'drain');
    if (!cluster) throw fail('notClustered');
    if (req.params.id !== cluster.node.id) throw fail('nodeNotFound', req.params.id);
    cluster.drain();
    const self = cluster.node.info().nodes.find((n) => n.id === cluster.node.id);
    return reply.code(202).send(self);
  });
}
