/**
 * Cluster mode on the wire (docs/api.md, Cluster). These two are open objects (no
 * `additionalProperties: false`): a node's capacity, load and templates are whatever the node
 * publishes, and an older or newer node may publish more.
 */
import Type, { type Static } from 'typebox';
import type { ClusterInfo as CoreClusterInfo, NodeInfo } from '../../core/cluster/cluster-node.js';
import { nullable, ref, stringEnum, fits } from './schema.js';

const anyObject = Type.Unsafe<object>({ type: 'object' });
const anyObjectOrNull = Type.Unsafe<object | null>({ type: ['object', 'null'] });

export const ClusterNode = Type.Object(
  {
    id: Type.String(),
    url: nullable(
      Type.String({
        description: 'Where peers and the proxy reach it; null for a node that is down.',
      }),
    ),
    state: stringEnum(['serving', 'draining', 'drained', 'down'], {
      description:
        '`serving` takes creates; `draining` takes none and hands its sandboxes and snapshots to other nodes; `drained`: a drain moved all its sandboxes and snapshots away; `down`: its lease expired while sandboxes still name it.',
    }),
    version: nullable(Type.String()),
    started_at: nullable(Type.String()),
    sandboxes: Type.Integer({
      description:
        'Sandboxes running there now; for a down node, those the catalog still gives it.',
    }),
    capacity: anyObjectOrNull,
    load: anyObjectOrNull,
    templates: anyObject,
  },
  { $id: 'ClusterNode', description: 'A node of the cluster as `GET /v1/cluster` shows it.' },
);
export type ClusterNode = Static<typeof ClusterNode>;
fits<NodeInfo, ClusterNode>(true);

export const ClusterInfo = Type.Object(
  {
    enabled: Type.Boolean(),
    node: nullable(Type.String({ description: 'The node that answered.' })),
    etcd: Type.Unsafe<{ connected?: boolean; pending_writes?: number } | null>({
      type: ['object', 'null'],
      properties: {
        connected: { type: 'boolean' },
        pending_writes: { type: 'integer' },
      },
    }),
    nodes: Type.Array(ref(ClusterNode)),
  },
  {
    $id: 'ClusterInfo',
    description: 'The cluster as the answering node sees it; `enabled: false` on a single hostd.',
  },
);
export type ClusterInfo = Static<typeof ClusterInfo>;
fits<CoreClusterInfo, ClusterInfo>(true);
