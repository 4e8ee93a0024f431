/**
 * Cluster mode: the nodes and their state, draining and undraining one (docs/api.md, Cluster), and the routes
 * between nodes (docs/cluster.md, Hand-over): a peer fetching an exported file of this node, a
 * peer handing a sandbox or a snapshot to this node, and a peer asking what to fetch to copy a
 * snapshot of this node. Those need the cluster's key (`X-Hostd-Cluster-Key`),
 * besides the API key every route needs.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ClusterNode } from '../../core/cluster/cluster-node.js';
import type { HandOver, HandOverOffer, SnapshotOffer } from '../../core/cluster/hand-over.js';
import { CLUSTER_KEY_HEADER } from '../../core/cluster/headers.js';
import { NODE_ID } from '../../core/cluster/records.js';
import type { SandboxManager } from '../../core/sandbox-manager.js';
import { fail } from '../../errors.js';
import { parseNoBody } from '../validate.js';

/** What the drain route starts: hand every sandbox to other nodes, take no creates. */
export type DrainStarter = () => void;

/** What the undrain route does: take creates again, and stop a running drain's further moves. */
export type Undrainer = () => Promise<void>;

/** Cluster mode's part of the server: this node, and what its drain and undrain routes do. */
export interface ClusterRoutes {
  readonly node: ClusterNode;
  readonly drain: DrainStarter;
  readonly undrain: Undrainer;
  readonly peer?: PeerRoutes;
}

/** The routes between nodes: their key, and what serves them. */
export interface PeerRoutes {
  readonly key: string;
  readonly handOver: HandOver;
  readonly manager: SandboxManager;
}

export function registerClusterRoutes(app: FastifyInstance, cluster: ClusterRoutes | null): void {
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

  // Another node's undrain is forwarded to it too (a down node's is 409 there): this one's.
  app.post<{ Params: { id: string } }>('/v1/cluster/nodes/:id/undrain', async (req) => {
    parseNoBody(req.body, 'undrain');
    if (!cluster) throw fail('notClustered');
    if (req.params.id !== cluster.node.id) throw fail('nodeNotFound', req.params.id);
    await cluster.undrain();
    return cluster.node.info().nodes.find((n) => n.id === cluster.node.id);
  });

  // A node gone for good: its sandboxes and snapshots leave the catalog (docs/cluster.md).
  app.delete<{ Params: { id: string } }>('/v1/cluster/nodes/:id', async (req) => {
    parseNoBody(req.body, 'forget');
    if (!cluster) throw fail('notClustered');
    if (!NODE_ID.test(req.params.id)) throw fail('nodeNotFound', req.params.id);
    const removed = await cluster.node.forgetNode(req.params.id);
    return { node: req.params.id, forgotten: removed };
  });

  const peer = cluster?.peer;
  const checkKey = (req: FastifyRequest): PeerRoutes => {
    if (!peer) throw fail('notClustered');
    const given = req.headers[CLUSTER_KEY_HEADER];
    if (typeof given !== 'string' || !sameSecret(given, peer.key)) throw fail('invalidClusterKey');
    return peer;
  };

  app.get<{ Querystring: { path?: string } }>('/v1/cluster/peer/files', async (req, reply) => {
    const { manager } = checkKey(req);
    const path = req.query.path;
    if (typeof path !== 'string' || path === '') {
      throw fail('invalidField', 'path', 'a file of an export', path);
    }
    const range = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    const offset = range ? Number(range[1]) : 0;
    const { size, stream } = await manager.readExported(path, offset);
    const start = Math.min(offset, size);
    void reply
      .type('application/octet-stream')
      .header('content-length', String(size - start))
      .header('accept-ranges', 'bytes');
    if (range) {
      void reply.code(206).header('content-range', `bytes ${start}-${size - 1}/${size}`);
    }
    return reply.send(stream);
  });

  app.post<{ Params: { id: string }; Body: unknown }>(
    '/v1/cluster/peer/sandboxes/:id/hand-over',
    async (req) => {
      const { handOver } = checkKey(req);
      return handOver.moveIn(parseOffer(req.body, req.params.id));
    },
  );

  // A node copying a snapshot this one holds (a create from it placed there): what to fetch.
  app.get<{ Params: { id: string } }>('/v1/cluster/peer/snapshots/:id/export', async (req) => {
    const { manager } = checkKey(req);
    return manager.exportSnapshot(req.params.id);
  });

  app.post<{ Params: { id: string }; Body: unknown }>(
    '/v1/cluster/peer/snapshots/:id/hand-over',
    async (req) => {
      const { handOver } = checkKey(req);
      return handOver.moveSnapshotIn(parseSnapshotOffer(req.body, req.params.id));
    },
  );
}

/** The body of a snapshot's hand-over, checked as far as this layer can. */
function parseSnapshotOffer(body: unknown, id: string): SnapshotOffer {
  const b = body as Partial<SnapshotOffer> | null;
  if (typeof b !== 'object' || b === null) throw fail('invalidField', 'body', 'an object', body);
  if (typeof b.from !== 'string' || !NODE_ID.test(b.from)) {
    throw fail('invalidField', 'from', 'a node id', b.from);
  }
  if (!Number.isSafeInteger(b.rev) || (b.rev as number) <= 0) {
    throw fail('invalidField', 'rev', 'the revision of the catalog entry', b.rev);
  }
  if (typeof b.record !== 'object' || b.record === null || b.record.id !== id) {
    throw fail('invalidField', 'record', `the record of snapshot ${id}`, b.record?.id);
  }
  const m = b.manifest;
  if (
    typeof m !== 'object' ||
    m === null ||
    !Array.isArray(m.parts) ||
    typeof m.state !== 'object'
  ) {
    throw fail('invalidField', 'manifest', 'an export of a frozen state', typeof m);
  }
  return b as SnapshotOffer;
}

/** The body of a hand-over, checked as far as this layer can (vm checks the manifest). */
function parseOffer(body: unknown, id: string): HandOverOffer {
  const b = body as Partial<HandOverOffer> | null;
  if (typeof b !== 'object' || b === null) throw fail('invalidField', 'body', 'an object', body);
  if (typeof b.from !== 'string' || !NODE_ID.test(b.from)) {
    throw fail('invalidField', 'from', 'a node id', b.from);
  }
  if (typeof b.record !== 'object' || b.record === null || b.record.id !== id) {
    throw fail('invalidField', 'record', `the record of sandbox ${id}`, b.record?.id);
  }
  const m = b.manifest;
  if (
    typeof m !== 'object' ||
    m === null ||
    !Array.isArray(m.parts) ||
    typeof m.paused !== 'object'
  ) {
    throw fail('invalidField', 'manifest', 'an export of a paused machine', typeof m);
  }
  return b as HandOverOffer;
}

/** Constant-time comparison of two secrets of any length. */
function sameSecret(a: string, b: string): boolean {
  const h = (s: string): Buffer => createHash('sha256').update(s).digest();
  return timingSafeEqual(h(a), h(b));
}
