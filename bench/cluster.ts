/**
 * Cluster mode's figures (issue 25, docs/cluster.md), on a cluster of its own started by the
 * testkit (testkit/cluster.ts: a 3-member etcd, three nodes on 127.0.0.2-4 serving
 * python-slim, HAProxy in front), after the main hostd has stopped:
 *
 * - `cluster_create_p50_ms`: a create through HAProxy, placement and the catalog entry
 *   included, each node's pool refilled before each sample (as `create_p50_ms` is a pool hit);
 * - `cluster_forward_exec_overhead_ms`: the p50 of `print(1)` asked of a node that does not run
 *   the sandbox, minus the p50 asked of the node that does (`cluster_direct_exec_p50_ms`),
 *   interleaved in alternating order, keep-alive clients;
 * - `drain_16_sandboxes_s`: from `POST /v1/cluster/nodes/{id}/drain` of a node holding 16
 *   sandboxes (each with REPL state) to the node `drained`, every sandbox handed to the other
 *   two (the other two are drained and restarted first, so that all 16 are placed on one); a
 *   drain that ends with something left fails the part at once (its `drain` report);
 * - `rolling_restart_3_nodes_lost_sandboxes`: those 16, then each node in turn stopped with
 *   SIGTERM (it drains), started again and waited for until `serving`: sandboxes that no longer
 *   answer `print(x)` with their value (must be 0);
 * - `node_loss_to_lost_s`: from a node's SIGKILL to another node answering `410 sandbox_lost`
 *   for its sandbox, with hostd's default lease TTL (SERVICE_CLUSTER_TTL_S, 10 s).
 */
import { Agent } from 'node:http';
import { drainNode, startCluster, type Cluster } from '../testkit/cluster.js';
import { eventually } from '../testkit/eventually.js';
import { run } from '../testkit/exec.js';
import type { Api } from '../testkit/hostd.js';
import { poolHolds } from '../testkit/metrics.js';
import { execHttp, now, pct, type Results } from './util.js';

export const CLUSTER_FIGURES = [
  'cluster_create_p50_ms',
  'cluster_forward_exec_overhead_ms',
  'cluster_direct_exec_p50_ms',
  'drain_16_sandboxes_s',
  'rolling_restart_3_nodes_lost_sandboxes',
  'node_loss_to_lost_s',
];

const TEMPLATE = 'python-slim';
const CREATES = 9;
const WARMUP = 3;
const EXECS = 40;
const DRAINED = 16;

async function createOn(api: Api): Promise<{ id: string }> {
  const res = await api.json<{ id: string }>('POST', '/v1/sandboxes', { template: TEMPLATE });
  if (res.status !== 200) throw new Error(`create: ${res.status} ${JSON.stringify(res.body)}`);
  return { id: res.body.id };
}

/** The node running sandbox `id` (its info's `node`). */
async function nodeOf(api: Api, id: string): Promise<string> {
  const res = await api.json<{ node: string }>('GET', `/v1/sandboxes/${id}`);
  if (res.status !== 200) throw new Error(`info of ${id}: ${res.status}`);
  return res.body.node;
}

export async function clusterFigures(): Promise<Results> {
  const cluster: Cluster = await startCluster({ templates: TEMPLATE });
  const made = new Set<string>();
  try {
    const poolsFull = (): Promise<void[]> =>
      Promise.all(cluster.nodes.map((n) => poolHolds(n.api, TEMPLATE, 1)));

    // Creates through the proxy, each a pool hit on whichever node it is placed on.
    const creates: number[] = [];
    for (let i = 0; i < CREATES; i++) {
      await poolsFull();
      const t = now();
      const s = await createOn(cluster.api);
      creates.push(now() - t);
      made.add(s.id);
      const del = await cluster.api.request('DELETE', `/v1/sandboxes/${s.id}`);
      if (del.status === 204) made.delete(s.id);
    }

    // One exec asked directly, one through another node, interleaved.
    await poolsFull();
    const s = await createOn(cluster.api);
    made.add(s.id);
    const owner = cluster.node(await nodeOf(cluster.api, s.id));
    const other = cluster.nodes.find((n) => n.id !== owner.id)!;
    const direct = new Agent({ keepAlive: true, maxSockets: 1 });
    const hop = new Agent({ keepAlive: true, maxSockets: 1 });
    const directMs: number[] = [];
    const hopMs: number[] = [];
    try {
      const timed = async (api: Api, agent: Agent): Promise<number> => {
        const t = now();
        await execHttp(api, agent, s.id, 'print(1)');
        return now() - t;
      };
      // Each pair in turn in either order: the second exec of a pair finds the guest warmer.
      for (let i = 0; i < WARMUP + EXECS; i++) {
        let d: number;
        let h: number;
        if (i % 2 === 0) {
          d = await timed(owner.api, direct);
          h = await timed(other.api, hop);
        } else {
          h = await timed(other.api, hop);
          d = await timed(owner.api, direct);
        }
        if (i < WARMUP) continue;
        directMs.push(d);
        hopMs.push(h);
      }
    } finally {
      direct.destroy();
      hop.destroy();
    }
    const directP50 = pct(directMs, 50);

    const { drainS, lost } = await drainAndRoll(cluster, made);

    // A node lost: its sandbox answers 410 on another node. It may have moved meanwhile, and
    // arrived paused (a paused sandbox on a node that is down is 503, not lost): run it first.
    const woke = await run(cluster.api, s.id, 'print(1)');
    if (woke.exit !== 0) throw new Error(`print(1) in ${s.id}: ${woke.stderr}`);
    const holder = cluster.node(await nodeOf(cluster.api, s.id));
    const witness = cluster.nodes.find((n) => n.id !== holder.id)!;
    await holder.kill();
    const killedAt = now();
    await eventually(
      `${s.id} to be lost with ${holder.id}`,
      async () =>
        (await witness.api.request('GET', `/v1/sandboxes/${s.id}`)).status === 410 ? true : null,
      { timeoutMs: 120_000, everyMs: 50 },
    );
    const lostS = (now() - killedAt) / 1000;

    return {
      cluster_create_p50_ms: pct(creates, 50),
      cluster_forward_exec_overhead_ms: Math.round((pct(hopMs, 50) - directP50) * 100) / 100,
      cluster_direct_exec_p50_ms: directP50,
      drain_16_sandboxes_s: drainS,
      rolling_restart_3_nodes_lost_sandboxes: lost,
      node_loss_to_lost_s: Math.round(lostS * 10) / 10,
    };
  } catch (err) {
    // The figures only say what timed out: the nodes' logs say why.
    process.stderr.write(`cluster part failed; cluster log tail:\n${cluster.logTail(120)}\n`);
    throw err;
  } finally {
    for (const id of made) {
      const live = cluster.nodes.find((n) => n.hostd);
      await live?.api.request('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
    }
    await cluster.close();
  }
}

/** The cluster's view of node `id`'s state (`serving`, `draining`, `drained`), as `api` sees it. */
async function nodeState(api: Api, id: string): Promise<string | undefined> {
  const v = await api.json<{ nodes?: { id: string; state: string }[] }>('GET', '/v1/cluster');
  return v.body.nodes?.find((n) => n.id === id)?.state;
}

/** Stops `node` with SIGTERM (a drain first), starts it, and waits until it serves again. */
async function restart(cluster: Cluster, id: string): Promise<void> {
  const node = cluster.node(id);
  const code = await node.stop('SIGTERM');
  if (code !== 0) throw new Error(`${id} stopped with ${code}`);
  await node.start();
  await eventually(
    `${id} to serve again`,
    async () => (await nodeState(cluster.api, id)) === 'serving',
    { timeoutMs: 300_000, everyMs: 200 },
  );
}

/**
 * 16 sandboxes with REPL state on one node, drained to the other two (timed); then a rolling
 * restart of the three nodes; returns the drain's seconds and how many sandboxes were lost.
 */
export async function drainAndRoll(
  cluster: Cluster,
  made: Set<string>,
): Promise<{ drainS: number; lost: number }> {
  const [first, ...rest] = cluster.nodes;
  // The others take no creates while the 16 are made, then come back empty and serving.
  // A drain that ends with something left fails at once with the nodes' log tail (the node
  // would stay draining): see testkit/cluster.ts drainNode.
  for (const n of rest) {
    await drainNode(cluster, n.id, { via: first!.api, timeoutMs: 300_000, everyMs: 200 });
  }
  const ids: string[] = [];
  for (let i = 0; i < DRAINED; i++) {
    const s = await createOn(first!.api);
    made.add(s.id);
    ids.push(s.id);
    const set = await run(first!.api, s.id, `x = ${i}`);
    if (set.exit !== 0) throw new Error(`x = ${i} in ${s.id}: ${set.stderr}`);
  }
  for (const n of rest) await restart(cluster, n.id);
  const t = now();
  await drainNode(cluster, first!.id, { via: rest[0]!.api, timeoutMs: 900_000, everyMs: 100 });
  const drainS = Math.round((now() - t) / 100) / 10;
  for (const n of cluster.nodes) await restart(cluster, n.id);
  let lost = 0;
  for (const [i, id] of ids.entries()) {
    const out = await run(cluster.api, id, 'print(x)').catch((err: Error) => err);
    if (out instanceof Error || out.stdout !== `${i}\n`) {
      lost++;
      const why = out instanceof Error ? out.message : JSON.stringify(out.events).slice(0, 300);
      process.stderr.write(`rolling restart lost ${id} (x = ${i}): ${why}\n`);
    }
  }
  if (lost > 0) process.stderr.write(`cluster log tail:\n${cluster.logTail(60)}\n`);
  return { drainS, lost };
}
