/**
 * Cluster mode end to end (docs/cluster.md): three hostd nodes on 127.0.0.2-4 with a 3-member
 * etcd and HAProxy in front (testkit/cluster.ts), python-slim VMs. Sandboxes are placed across
 * the nodes and recorded in the catalog; any node serves any sandbox by forwarding (exec NDJSON,
 * files, errors intact); lists span the cluster; forks stay on the parent's node; a drained node
 * takes no creates; a node stopped cleanly keeps its sandboxes; a SIGKILLed node's sandboxes answer 410 sandbox_lost naming it, and can be
 * deleted through the others. One cluster is shared by the file's tests, in order.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { startCluster, type Cluster } from '../../testkit/cluster.js';
import { eventually } from '../../testkit/eventually.js';
import { execEvents, run } from '../../testkit/exec.js';
import { readBytes, upload } from '../../testkit/files.js';
import type { Api, ErrorBody } from '../../testkit/hostd.js';
import type { SandboxInfo } from '../../testkit/sandboxes.js';

type Info = SandboxInfo & { node: string };

interface ClusterView {
  node: string;
  etcd: { connected: boolean };
  nodes: { id: string; state: string; sandboxes: number }[];
}

let cluster: Cluster;
/** Sandboxes this file created and has not deleted (deleted in `after`, whatever happened). */
const created = new Set<string>();

const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

async function create(api: Api): Promise<Info> {
  const res = await api.json<{ id: string }>('POST', '/v1/sandboxes', { template: 'python-slim' });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  created.add(res.body.id);
  return info(api, res.body.id);
}

async function info(api: Api, id: string): Promise<Info> {
  const res = await api.json<Info>('GET', `/v1/sandboxes/${id}`);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

/** A node's client that is not `owner`. */
const elsewhere = (owner: string): Api => cluster.nodes.find((n) => n.id !== owner && n.hostd)!.api;

before(async () => {
  cluster = await startCluster({ ttlS: 4 });
});

after(async () => {
  if (!cluster) return;
  for (const id of created) {
    const live = cluster.nodes.find((n) => n.hostd);
    await live?.api.request('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  }
  await cluster.close();
});

/** On failure: the nodes' log tails, so the sandbox ids and their nodes' view are in the report. */
async function reported(fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } catch (err) {
    process.stderr.write(`cluster log tail:\n${cluster.logTail(25)}\n`);
    throw err;
  }
}

describe('a three-node cluster', () => {
  let sandboxes: Info[] = [];

  test('every node sees the three nodes serving, etcd connected', () =>
    reported(async () => {
      for (const n of cluster.nodes) {
        const res = await n.api.json<ClusterView>('GET', '/v1/cluster');
        assert.equal(res.status, 200);
        assert.equal(res.body.node, n.id);
        assert.equal(res.body.etcd.connected, true);
        assert.deepEqual(
          res.body.nodes.map((x) => [x.id, x.state]),
          cluster.nodes.map((x) => [x.id, 'serving']),
        );
      }
    }));

  test('creates through HAProxy are spread over the nodes, and each says its node', () =>
    reported(async () => {
      for (let i = 0; i < 3; i++) sandboxes.push(await create(cluster.api));
      const nodes = new Set(sandboxes.map((s) => s.node));
      for (const s of sandboxes)
        assert.ok(
          cluster.nodes.some((n) => n.id === s.node),
          s.node,
        );
      assert.ok(nodes.size >= 2, `all three sandboxes on ${[...nodes].join(', ')}`);
    }));

  test('any node runs code in any sandbox: REPL state and NDJSON events through the hop', () =>
    reported(async () => {
      for (const s of sandboxes) {
        const owner = cluster.node(s.node).api;
        const other = elsewhere(s.node);
        assert.equal((await run(owner, s.id, 'x = 41')).exit, 0);
        const events = await execEvents(other, s.id, 'print(x + 1)\nprint("two")');
        assert.deepEqual(
          events.filter((e) => e.type === 'stdout').map((e) => e.data),
          ['42', 'two'],
        );
        assert.equal(events.at(-1)?.type, 'exit');
        assert.equal(events.at(-1)?.data, 0);
        // The sandbox stays where it was: forwarding moves nothing.
        assert.equal((await info(other, s.id)).node, s.node);
      }
    }));

  test('files go in through one node and out through another, byte for byte', () =>
    reported(async () => {
      const s = sandboxes[0]!;
      const data = randomBytes(2 * 1024 * 1024 + 5);
      const [first, second] = cluster.nodes.filter((n) => n.id !== s.node);
      const put = await upload(first!.api, s.id, '/home/user/data.bin', data);
      assert.equal(put.status, 200, JSON.stringify(put.body));
      const back = await readBytes(second!.api, s.id, '/home/user/data.bin');
      assert.equal(sha(back), sha(data));
      const seen = await run(
        cluster.node(s.node).api,
        s.id,
        'import os; print(os.path.getsize("/home/user/data.bin"))',
      );
      assert.equal(seen.stdout.trim(), String(data.length));
    }));

  test("errors of the sandbox's node reach the client as they are", () =>
    reported(async () => {
      const s = sandboxes[0]!;
      const other = elsewhere(s.node);
      const bad = await other.json<ErrorBody>('POST', `/v1/sandboxes/${s.id}/exec`, { cod: 1 });
      assert.equal(bad.status, 400);
      assert.equal(bad.body.code, 'invalid_request');
      const missing = await other.json<ErrorBody>(
        'GET',
        `/v1/sandboxes/sbx_${'0'.repeat(32)}/files?path=/x`,
      );
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'sandbox_not_found');
      const noFile = await other.json<ErrorBody>('GET', `/v1/sandboxes/${s.id}/files?path=/nope`);
      assert.equal(noFile.status, 404);
      assert.equal(noFile.body.code, 'file_not_found');
    }));

  test('the list of any node holds every sandbox of the cluster, with its node', () =>
    reported(async () => {
      for (const n of cluster.nodes) {
        const res = await n.api.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes');
        assert.equal(res.status, 200);
        const byId = new Map(res.body.sandboxes.map((s) => [s.id, s.node]));
        for (const s of sandboxes) assert.equal(byId.get(s.id), s.node, `${s.id} from ${n.id}`);
      }
    }));

  test("a fork asked of another node stays on the parent's node; children run there", () =>
    reported(async () => {
      const parent = sandboxes[1]!;
      const res = await elsewhere(parent.node).json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${parent.id}/fork`,
        { n: 2 },
      );
      assert.equal(res.status, 200, JSON.stringify(res.body));
      for (const c of res.body.children) created.add(c.id);
      for (const c of res.body.children) {
        const child = await info(cluster.api, c.id);
        assert.equal(child.node, parent.node);
        assert.equal(child.parent_id, parent.id);
        assert.equal((await run(elsewhere(parent.node), c.id, 'print(x)')).stdout, '41\n');
      }
      for (const c of res.body.children) {
        const del = await elsewhere(parent.node).request('DELETE', `/v1/sandboxes/${c.id}`);
        assert.equal(del.status, 204);
        created.delete(c.id);
        const gone = await cluster.api.json<ErrorBody>('GET', `/v1/sandboxes/${c.id}`);
        assert.equal(gone.status, 404);
      }
    }));

  test('a drained node takes no creates; the others do', () =>
    reported(async () => {
      const target = cluster.nodes[2]!;
      const res = await cluster.nodes[0]!.api.json<{ id: string; state: string }>(
        'POST',
        `/v1/cluster/nodes/${target.id}/drain`,
      );
      assert.equal(res.status, 202, JSON.stringify(res.body));
      assert.equal(res.body.state, 'draining');
      await eventually(
        'every node to see the drain',
        async () => {
          for (const n of cluster.nodes) {
            const v = await n.api.json<ClusterView>('GET', '/v1/cluster');
            if (v.body.nodes.find((x) => x.id === target.id)?.state !== 'draining') return false;
          }
          return true;
        },
        { timeoutMs: 30_000, everyMs: 100 },
      );
      // Asked of the draining node itself: placed elsewhere.
      const s = await create(target.api);
      assert.notEqual(s.node, target.id);
      const del = await cluster.api.request('DELETE', `/v1/sandboxes/${s.id}`);
      assert.equal(del.status, 204);
      created.delete(s.id);
      const unknown = await cluster.api.json<ErrorBody>('POST', '/v1/cluster/nodes/nope/drain');
      assert.equal(unknown.status, 404);
      assert.equal(unknown.body.code, 'node_not_found');
    }));

  test('a node stopped cleanly keeps its sandboxes paused (503 meanwhile); back, they serve', () =>
    reported(async () => {
      const kept = sandboxes[0]!;
      const node = cluster.node(kept.node);
      const asker = elsewhere(kept.node);
      assert.equal(await node.stop('SIGTERM'), 0);
      const away = await asker.json<ErrorBody>('GET', `/v1/sandboxes/${kept.id}`);
      assert.equal(away.status, 503, JSON.stringify(away.body));
      assert.equal(away.body.code, 'node_unavailable');
      await node.start();
      const back = await eventually(
        `${kept.id} to serve again through another node`,
        async () => {
          const res = await asker.json<Info>('GET', `/v1/sandboxes/${kept.id}`);
          return res.status === 200 ? res.body : null;
        },
        { timeoutMs: 120_000, everyMs: 200 },
      );
      assert.equal(back.node, kept.node);
      assert.equal((await run(asker, kept.id, 'print(x)')).stdout, '41\n');
    }));

  test("a SIGKILLed node's sandboxes answer 410 sandbox_lost naming it, and can be deleted", () =>
    reported(async () => {
      // Not the node restarted above: its sandboxes were proven kept.
      const victim = sandboxes.find((s) => s.node !== sandboxes[0]!.node) ?? sandboxes[0]!;
      const node = cluster.node(victim.node);
      await node.kill();
      const asker = elsewhere(victim.node);
      const lost = await eventually(
        `${victim.id} to be lost with ${victim.node}`,
        async () => {
          const res = await asker.json<ErrorBody>('GET', `/v1/sandboxes/${victim.id}`);
          return res.status === 410 ? res.body : null;
        },
        { timeoutMs: 60_000, everyMs: 100 },
      );
      assert.equal(lost.code, 'sandbox_lost');
      assert.ok(lost.error.includes(victim.node), lost.error);
      const exec = await asker.json<ErrorBody>('POST', `/v1/sandboxes/${victim.id}/exec`, {
        code: 'print(1)',
      });
      assert.equal(exec.status, 410);
      assert.equal(exec.body.code, 'sandbox_lost');
      const list = await asker.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes');
      const listed = list.body.sandboxes.find((s) => s.id === victim.id);
      assert.equal(listed?.state, 'failed');
      assert.equal(listed?.node, victim.node);
      const view = await asker.json<ClusterView>('GET', '/v1/cluster');
      assert.equal(view.body.nodes.find((n) => n.id === victim.node)?.state, 'down');
      // The other sandboxes serve on.
      for (const s of sandboxes.filter((x) => x.node !== victim.node)) {
        assert.equal((await run(asker, s.id, 'print(x)')).stdout, '41\n');
      }
      const del = await asker.request('DELETE', `/v1/sandboxes/${victim.id}`);
      assert.equal(del.status, 204);
      created.delete(victim.id);
      const gone = await asker.json<ErrorBody>('GET', `/v1/sandboxes/${victim.id}`);
      assert.equal(gone.status, 404);
      assert.equal(gone.body.code, 'sandbox_not_found');
      sandboxes = sandboxes.filter((s) => s.node !== victim.node);
    }));
});
