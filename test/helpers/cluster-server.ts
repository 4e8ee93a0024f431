/**
 * A cluster node served over real HTTP on loopback, without VMs: a SandboxManager on the fake
 * hypervisor with its ClusterNode on an in-memory store (cluster-manager.ts), HttpPeers with the
 * cluster's key, a HandOver, and hostd's native server in front with the cluster routes. The
 * HTTP-level cluster tests (peer routes, snapshot copies, the E2B front) differ only in the
 * options below, so that what a node is made of is written once.
 */
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { createMetrics } from '../../src/api/metrics.js';
import { buildServer } from '../../src/api/server.js';
import { HttpPeers } from '../../src/cluster/peer-http.js';
import type { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import { Drainer } from '../../src/core/cluster/drain.js';
import { HandOver } from '../../src/core/cluster/hand-over.js';
import { SnapshotCopies } from '../../src/core/cluster/snapshot-copies.js';
import type { ManagerOptions, SandboxManager } from '../../src/core/sandbox-manager.js';
import { connect, type Api } from '../../testkit/hostd.js';
import { startClusterManager } from './cluster-manager.js';
import type { MemoryStore } from './memory-kv.js';

export interface ServedNode<P extends HttpPeers = HttpPeers> {
  id: string;
  cluster: ClusterNode;
  manager: SandboxManager;
  handOver: HandOver;
  drainer: Drainer;
  peers: P;
  app: FastifyInstance;
  /** The native API with the node's key. */
  api: Api;
  url: string;
  stopped: boolean;
}

export interface ServedNodeOptions<P extends HttpPeers> {
  apiKey: string;
  clusterKey: string;
  log: Logger;
  /** The node's manager options (a smaller cap, other templates). */
  overrides?: Partial<ManagerOptions>;
  /** Its peers (a subclass that counts); HttpPeers with the keys above when absent. */
  peers?: (options: ConstructorParameters<typeof HttpPeers>[0]) => P;
  /** Whether a create from a snapshot held elsewhere copies it here (snapshot-copies.ts). */
  copies?: boolean;
  /**
   * What the drain route does: `drainer` runs the node's real drain (hand-overs over HTTP);
   * `state` only marks the node draining, for tests about where creates go.
   */
  drain?: 'drainer' | 'state';
  /** Done after the server listens and before the node joins (an E2B front's URL to publish). */
  beforeStart?: (node: ServedNode<P>) => Promise<void>;
}

/** Starts node `id` on `store`, served on loopback, and has it join the cluster. */
export async function startServedNode<P extends HttpPeers = HttpPeers>(
  store: MemoryStore,
  id: string,
  options: ServedNodeOptions<P>,
): Promise<ServedNode<P>> {
  const { apiKey, clusterKey, log } = options;
  const { cluster, manager } = await startClusterManager(store, id, log, options.overrides);
  const peerOptions = { self: id, clusterKey, apiKey };
  const peers = options.peers ? options.peers(peerOptions) : (new HttpPeers(peerOptions) as P);
  const handOver = new HandOver(cluster, manager, peers, log);
  if (options.copies ?? true) cluster.bindCopies(new SnapshotCopies(cluster, manager, peers, log));
  const drainer = new Drainer(cluster, manager, handOver, log);
  let app: FastifyInstance | undefined;
  try {
    app = await buildServer({
      manager,
      auth: { kind: 'keys', keys: [apiKey] },
      maxBodyBytes: 1 << 20,
      maxFileBytes: 1 << 20,
      logger: log,
      metrics: createMetrics({ accel: 'tcg', version: 'test' }),
      cluster: {
        node: cluster,
        drain:
          options.drain === 'drainer'
            ? () => void drainer.drain()
            : () => void cluster.setState('draining'),
        undrain:
          options.drain === 'drainer' ? () => drainer.undrain() : () => cluster.setState('serving'),
        peer: { key: clusterKey, handOver, manager },
      },
    });
    const url = await app.listen({ host: '127.0.0.1', port: 0 });
    cluster.url = url;
    const node: ServedNode<P> = {
      id,
      cluster,
      manager,
      handOver,
      drainer,
      peers,
      app,
      api: connect(url, apiKey),
      url,
      stopped: false,
    };
    await options.beforeStart?.(node);
    await cluster.start();
    return node;
  } catch (err) {
    // Nothing of a node that failed to start is left: a server left listening would keep the
    // test file's process alive, hanging the run instead of reporting the failure.
    await stopParts(manager, cluster, peers, app).catch(() => undefined);
    throw err;
  }
}

/** Stops a node's parts, each tried though an earlier one fails; throws the first failure. */
async function stopParts(
  manager: SandboxManager,
  cluster: ClusterNode,
  peers: HttpPeers,
  app: FastifyInstance | undefined,
): Promise<void> {
  const failures: unknown[] = [];
  const attempt = async (step: () => unknown): Promise<void> => {
    try {
      await step();
    } catch (err) {
      failures.push(err);
    }
  };
  await attempt(() => manager.shutdown());
  await attempt(() => cluster.stop());
  await attempt(() => peers.close());
  await attempt(() => app?.close());
  if (failures.length > 0) throw failures[0];
}

/**
 * Stops each node given (once; those not started, undefined, are passed over), every one of
 * them though one fails to stop; then throws the first failure.
 */
export async function stopServedNodes(
  ...nodes: (ServedNode<HttpPeers> | undefined)[]
): Promise<void> {
  const failures: unknown[] = [];
  for (const n of nodes) {
    if (!n || n.stopped) continue;
    n.stopped = true;
    await stopParts(n.manager, n.cluster, n.peers, n.app).catch((err: unknown) =>
      failures.push(err),
    );
  }
  if (failures.length > 0) throw failures[0];
}

/** What `code` prints on sandbox `id`, asked through a node's native API. */
export async function execStdout(api: Api, id: string, code: string): Promise<string> {
  const res = await api.request('POST', `/v1/sandboxes/${id}/exec`, { code });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.text())
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { type: string; data: unknown })
    .filter((e) => e.type === 'stdout')
    .map((e) => String(e.data))
    .join('\n');
}
