/**
 * Cluster mode on the wire (docs/api.md, Cluster). These are open objects (no
 * `additionalProperties: false`): a node's capacity, load, templates and drain report are
 * whatever the node publishes, and an older or newer node may publish more.
 */
import Type, { type Static } from 'typebox';
import type { ClusterInfo as CoreClusterInfo, NodeInfo } from '../../core/cluster/cluster-node.js';
import { nullable, orNull, ref, stringEnum, fits } from './schema.js';

const anyObject = Type.Unsafe<object>({ type: 'object' });
const anyObjectOrNull = Type.Unsafe<object | null>({ type: ['object', 'null'] });

export const DrainReport = Type.Object(
  {
    started_at: Type.String({ description: 'When this round started (each drain is one).' }),
    ended_at: nullable(
      Type.String({ description: 'When it ended; null while it runs (its counts grow).' }),
    ),
    moved: Type.Integer({ description: 'Sandboxes it handed to other nodes.' }),
    left: nullable(
      Type.Integer({
        description:
          'Sandboxes still on the node when it ended (failed ones, and those no node took); null while it runs.',
      }),
    ),
    snapshots_moved: Type.Integer({
      description: 'Snapshots it handed over, or left to another node holding a copy.',
    }),
    snapshots_left: nullable(
      Type.Integer({
        description: 'Snapshots still on the node when it ended; null while it runs.',
      }),
    ),
    left_sandboxes: Type.Optional(
      nullable(
        Type.Array(Type.String(), {
          description:
            'The ids of the sandboxes counted in `left`, sorted, at most 100 (`left` is the count that holds); null while it runs. Absent from reports of nodes older than it.',
        }),
      ),
    ),
    left_snapshots: Type.Optional(
      nullable(
        Type.Array(Type.String(), {
          description:
            'The ids of the snapshots counted in `snapshots_left`, sorted, at most 100; null while it runs. Absent from reports of older nodes.',
        }),
      ),
    ),
    undrained_at: Type.Optional(
      nullable(
        Type.String({
          description:
            'When `POST /v1/cluster/nodes/{id}/undrain` returned the node to `serving` during or after this round (a running round then starts no further move); null when none has. Absent from reports of older nodes.',
        }),
      ),
    ),
  },
  {
    $id: 'DrainReport',
    description:
      "A node's last drain since it started. One that ended with something left (`left` or `snapshots_left` > 0) leaves the node `draining`: it takes no creates, and will not become `drained` by itself; draining it again retries what is left; undraining it returns it to `serving`.",
  },
);
export type DrainReport = Static<typeof DrainReport>;

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
    drain: orNull(ref(DrainReport), {
      description:
        'Its last drain since it started, running or ended; null when it has not drained since, or is down.',
    }),
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
