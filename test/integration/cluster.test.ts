/**
 * Cluster mode end to end (docs/cluster.md): three hostd nodes on 127.0.0.2-4 with a 3-member
 * etcd and HAProxy in front (testkit/cluster.ts), python-slim VMs. Sandboxes are placed across
 * the nodes and recorded in the catalog; any node serves any sandbox by forwarding (exec NDJSON,
 * files, errors intact), on the native API and on the E2B front (E2B's published SDKs, signed
 * URLs included); lists span the cluster; forks stay on the parent's node, as do E2B creates from
 * a snapshot's name; E2B's batch metrics answer for every node's sandboxes; a drain hands the
 * node's sandboxes (running and paused) to the others, which serve them with their REPL state,
 * and the node takes no creates; SIGTERM drains before the stop; a create from a snapshot whose
 * node drains is made on another node, which copies the snapshot, and the drain leaves the
 * snapshot there instead of copying it again; a SIGKILLed node's sandboxes answer
 * 410 sandbox_lost naming it and can be deleted through the others, and once it is back it
 * re-adopts what it kept and fences what was deleted; one etcd member down changes nothing,
 * etcd down refuses creates while placed sandboxes serve; a rolling restart (each node drained by
 * its SIGTERM) keeps every sandbox serving with its REPL state.
 * One cluster is shared by the file's tests, in order.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { Sandbox } from '@e2b/code-interpreter';
import {
  nodeView,
  startCluster,
  undrainNode,
  waitDrained,
  type Cluster,
  type ClusterNode,
  type NodeView,
} from '../../testkit/cluster.js';
import { E2B_TEST_KEY } from '../../testkit/e2b.js';
import { eventually } from '../../testkit/eventually.js';
import { execEvents, openExec, run } from '../../testkit/exec.js';
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
  // E2B's key format, so that E2B's SDKs take the key as they take a real one.
  cluster = await startCluster({ ttlS: 4, apiKey: E2B_TEST_KEY });
});

/** E2B's SDKs pointed at one node's E2B front, as E2B_API_URL and E2B_SANDBOX_URL would. */
const viaE2b = (n: ClusterNode) => ({
  apiKey: E2B_TEST_KEY,
  apiUrl: n.e2bUrl,
  sandboxUrl: n.e2bUrl,
  // A loaded TCG host: a first cell takes seconds
  requestTimeoutMs: 300_000,
});

/** A raw request to a node's E2B front with the control plane's key. */
async function e2bFetch(
  n: ClusterNode,
  method: string,
  path: string,
  opts: { body?: unknown; headers?: Record<string, string> } = {},
): Promise<{ status: number; headers: Headers; json: Record<string, unknown> }> {
  const res = await fetch(n.e2bUrl + path, {
    method,
    headers: {
      'x-api-key': E2B_TEST_KEY,
      ...(opts.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...opts.headers,
    },
    ...(opts.body !== undefined ? { body: JSON.stringify(opts.body) } : {}),
  });
  const text = await res.text();
  return {
    status: res.status,
    headers: res.headers,
    json: (text ? JSON.parse(text) : {}) as Record<string, unknown>,
  };
}

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
  /** The node the drain test drained (the undrain test returns it to serving). */
  let drainedNode: string | undefined;
  /** Set by the SIGKILL test: a sandbox kept on the killed node, and one deleted meanwhile. */
  let survivor: Info | null = null;
  let deletedWhileAway = '';

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

  test("E2B's SDKs on one node drive a sandbox placed on another: commands, files, runCode, kill", () =>
    reported(async () => {
      const first = cluster.nodes[0]!;
      const sbx = await Sandbox.create({ ...viaE2b(first), metadata: { suite: 'cluster-e2b' } });
      created.add(sbx.sandboxId);
      // Placed by the cluster and in its catalog: every node knows where it runs.
      const owner = (await info(cluster.api, sbx.sandboxId)).node;
      const asker = cluster.nodes.find((n) => n.id !== owner)!;
      const remote = await Sandbox.connect(sbx.sandboxId, viaE2b(asker));

      // envd's Connect RPC, streamed through the hop.
      const out: string[] = [];
      const cmd = await remote.commands.run('echo one; echo two >&2; echo three', {
        onStdout: (d) => void out.push(d),
        timeoutMs: 0,
      });
      assert.equal(cmd.exitCode, 0);
      assert.equal(cmd.stdout, 'one\nthree\n');
      assert.equal(cmd.stderr, 'two\n');
      assert.equal(out.join(''), 'one\nthree\n');

      // envd's /files both ways, byte for byte; the native API of its own node reads the same.
      const data = randomBytes(1024 * 1024 + 3);
      await remote.files.write('/home/user/e2b.bin', new Blob([data]));
      const back = await remote.files.read('/home/user/e2b.bin', { format: 'bytes' });
      assert.equal(sha(back), sha(data));
      const native = await readBytes(cluster.node(owner).api, sbx.sandboxId, '/home/user/e2b.bin');
      assert.equal(sha(native), sha(data));
      assert.equal(
        (await remote.files.list('/home/user')).some((e) => e.name === 'e2b.bin'),
        true,
      );

      // Signed URLs name no sandbox: the node they reach finds whose signature they carry.
      const download = await remote.downloadUrl('/home/user/e2b.bin');
      assert.ok(download.startsWith(`${asker.e2bUrl}/files?`), download);
      const fetched = await fetch(download);
      assert.equal(fetched.status, 200);
      assert.equal(sha(new Uint8Array(await fetched.arrayBuffer())), sha(data));
      const form = new FormData();
      form.append('file', new Blob(['uploaded by URL']), 'up.txt');
      const put = await fetch(await remote.uploadUrl('/home/user/up.txt'), {
        method: 'POST',
        body: form,
      });
      assert.equal(put.status, 200, await put.clone().text());
      assert.equal(await remote.files.read('/home/user/up.txt'), 'uploaded by URL');
      const expired = await fetch(
        await remote.downloadUrl('/home/user/up.txt', { useSignatureExpiration: -10_000 }),
      );
      assert.deepEqual(
        [expired.status, await expired.json()],
        [401, { code: 401, message: 'signature is already expired' }],
      );

      // The code interpreter's /execute, its lines streamed as they come.
      const lines: string[] = [];
      const cell = await remote.runCode('y = 6 * 7\nprint("a")\nprint("b")\ny', {
        onStdout: (m) => void lines.push(m.line),
        timeoutMs: 0,
      });
      assert.equal(cell.error, undefined);
      assert.equal(cell.text, '42');
      assert.deepEqual(lines, ['a\n', 'b\n']);
      assert.equal((await remote.runCode('y + 1', { timeoutMs: 0 })).text, '43');

      // The control plane: info and lists through any node.
      const got = await Sandbox.getInfo(sbx.sandboxId, viaE2b(asker));
      assert.equal(got.sandboxId, sbx.sandboxId);
      assert.deepEqual(got.metadata, { suite: 'cluster-e2b' });
      for (const n of cluster.nodes) {
        const page = await Sandbox.list({
          ...viaE2b(n),
          query: { metadata: { suite: 'cluster-e2b' } },
        }).nextItems();
        assert.deepEqual(
          page.map((x) => x.sandboxId),
          [sbx.sandboxId],
          `listed by ${n.id}`,
        );
      }

      // Errors of the sandbox's node reach the client as they are: a wrong token is its 401.
      const denied = await e2bFetch(asker, 'GET', '/files?path=/home/user/e2b.bin', {
        headers: {
          'e2b-sandbox-id': sbx.sandboxId,
          'e2b-sandbox-port': '49983',
          'x-access-token': 'not-the-token',
        },
      });
      assert.equal(denied.status, 401);
      assert.equal(denied.json.code, 401);

      // Kill through a node that does not run it: gone everywhere.
      assert.equal(await Sandbox.kill(sbx.sandboxId, viaE2b(asker)), true);
      created.delete(sbx.sandboxId);
      const gone = await cluster.api.json<ErrorBody>('GET', `/v1/sandboxes/${sbx.sandboxId}`);
      assert.equal(gone.status, 404);
      assert.equal(await Sandbox.kill(sbx.sandboxId, viaE2b(asker)), false);
      const stale = await e2bFetch(asker, 'POST', '/execute', {
        body: { code: '1' },
        headers: { 'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': '49999' },
      });
      assert.equal(stale.status, 502, 'E2B proxy answer for a sandbox that is not running');
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

  test("E2B's create from a snapshot's name, asked of another node, runs on the snapshot's node; batch metrics span the nodes", () =>
    reported(async () => {
      const source = sandboxes[1]!; // x = 41 in its REPL
      const holder = cluster.node(source.node);
      const asker = cluster.nodes.find((n) => n.id !== holder.id && n.hostd)!;
      const snap = await e2bFetch(asker, 'POST', `/sandboxes/${source.id}/snapshots`, {
        body: { name: 'cluster-ckpt' },
      });
      assert.equal(snap.status, 201, JSON.stringify(snap.json));
      const snapshotID = String(snap.json.snapshotID);
      try {
        const made = await e2bFetch(asker, 'POST', '/v2/sandboxes', {
          body: { templateID: 'cluster-ckpt' },
        });
        assert.equal(made.status, 201, JSON.stringify(made.json));
        const id = String(made.json.sandboxID);
        created.add(id);
        const child = await info(cluster.api, id);
        assert.equal(child.node, holder.id, 'made where the snapshot is');
        assert.equal(child.snapshot_id, snapshotID);
        assert.equal((await run(asker.api, id, 'print(x)')).stdout, '41\n');

        // The latest sample of sandboxes on several nodes, through each node, in the order asked.
        const ids = [id, ...sandboxes.map((s) => s.id)];
        for (const n of cluster.nodes) {
          await eventually(`${n.id} to answer every sandbox's metrics`, async () => {
            const res = await e2bFetch(n, 'GET', `/sandboxes/metrics?sandbox_ids=${ids.join(',')}`);
            assert.equal(res.status, 200, JSON.stringify(res.json));
            const got = Object.keys(res.json.sandboxes as Record<string, unknown>);
            return got.join(',') === ids.join(',');
          });
        }
        assert.equal(await Sandbox.kill(id, viaE2b(asker)), true);
        created.delete(id);
      } finally {
        await e2bFetch(asker, 'DELETE', `/templates/${snapshotID}`);
      }
    }));

  test('a drain hands its sandboxes (REPL state kept, a paused one too) and its snapshot to the others; creates go elsewhere', () =>
    reported(async () => {
      const kept = sandboxes[0]!;
      const target = cluster.node(kept.node);
      // A paused sandbox on the node: a fork child (forks stay on the parent's node), paused.
      const fork = await cluster.api.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${kept.id}/fork`,
        { n: 1 },
      );
      assert.equal(fork.status, 200, JSON.stringify(fork.body));
      const child = fork.body.children[0]!.id;
      created.add(child);
      assert.equal((await run(cluster.api, child, 'y = 7')).exit, 0);
      const paused = await cluster.api.json<Info>('POST', `/v1/sandboxes/${child}/pause`);
      assert.equal(paused.status, 200, JSON.stringify(paused.body));
      assert.equal((await info(cluster.api, child)).node, target.id);
      // A snapshot of the node's sandbox, named: it moves with the drain.
      const snap = await cluster.api.json<{ snapshot_id: string }>(
        'POST',
        `/v1/sandboxes/${kept.id}/snapshot`,
        { name: 'drain-ckpt' },
      );
      assert.equal(snap.status, 200, JSON.stringify(snap.body));
      const snapshotId = snap.body.snapshot_id;
      const res = await elsewhere(target.id).json<NodeView>(
        'POST',
        `/v1/cluster/nodes/${target.id}/drain`,
      );
      assert.equal(res.status, 202, JSON.stringify(res.body));
      assert.equal(res.body.state, 'draining');
      assert.equal(res.body.drain?.ended_at, null);
      // Seen by every node; a drain that ends with something left fails here at once.
      for (const n of cluster.nodes) {
        const seen = await waitDrained(cluster, target.id, {
          via: n.api,
          since: res.body.drain!.started_at,
          timeoutMs: 240_000,
          everyMs: 250,
        });
        assert.equal(seen.drain?.left, 0);
        assert.equal(seen.drain?.snapshots_left, 0);
        assert.ok(seen.drain.moved >= 2, JSON.stringify(seen.drain));
        assert.ok(seen.drain.snapshots_moved >= 1, JSON.stringify(seen.drain));
      }
      // Every sandbox it held is elsewhere now, under its id, with its REPL state, through any node.
      const moved = await info(cluster.api, kept.id);
      assert.notEqual(moved.node, target.id);
      for (const n of cluster.nodes) {
        assert.equal((await run(n.api, kept.id, 'print(x + 1)')).stdout, '42\n');
      }
      const movedChild = await info(target.api, child);
      assert.notEqual(movedChild.node, target.id);
      assert.equal(movedChild.state, 'paused');
      assert.equal(movedChild.paused_by, 'request');
      assert.equal((await run(target.api, child, 'print(y)')).stdout, '7\n');
      assert.equal((await info(cluster.api, child)).state, 'ready');
      assert.equal((await cluster.api.request('DELETE', `/v1/sandboxes/${child}`)).status, 204);
      created.delete(child);
      sandboxes = await Promise.all(sandboxes.map((s) => info(cluster.api, s.id)));
      assert.ok(sandboxes.every((s) => s.node !== target.id));
      // Asked of the drained node itself: placed elsewhere.
      const s = await create(target.api);
      assert.notEqual(s.node, target.id);
      const del = await cluster.api.request('DELETE', `/v1/sandboxes/${s.id}`);
      assert.equal(del.status, 204);
      created.delete(s.id);
      // So is an E2B create asked of its E2B front.
      const viaE2bFront = await e2bFetch(target, 'POST', '/v2/sandboxes', {
        body: { templateID: 'python-slim' },
      });
      assert.equal(viaE2bFront.status, 201, JSON.stringify(viaE2bFront.json));
      const e2bId = String(viaE2bFront.json.sandboxID);
      created.add(e2bId);
      assert.notEqual((await info(cluster.api, e2bId)).node, target.id);
      const e2bDel = await e2bFetch(target, 'DELETE', `/sandboxes/${e2bId}`);
      assert.equal(e2bDel.status, 204);
      created.delete(e2bId);
      // Its snapshot is another node's now: created from by id through the drained node, and by
      // its name through the drained node's E2B front, both made there with the REPL state.
      const fromSnap = await target.api.json<{ id: string }>('POST', '/v1/sandboxes', {
        snapshot: snapshotId,
      });
      assert.equal(fromSnap.status, 200, JSON.stringify(fromSnap.body));
      created.add(fromSnap.body.id);
      const snapHolder = (await info(cluster.api, fromSnap.body.id)).node;
      assert.notEqual(snapHolder, target.id);
      assert.equal((await run(target.api, fromSnap.body.id, 'print(x)')).stdout, '41\n');
      const byName = await e2bFetch(target, 'POST', '/v2/sandboxes', {
        body: { templateID: 'drain-ckpt' },
      });
      assert.equal(byName.status, 201, JSON.stringify(byName.json));
      const byNameId = String(byName.json.sandboxID);
      created.add(byNameId);
      const byNameInfo = await info(cluster.api, byNameId);
      assert.equal(byNameInfo.node, snapHolder);
      assert.equal(byNameInfo.snapshot_id, snapshotId);
      for (const id of [fromSnap.body.id, byNameId]) {
        assert.equal((await cluster.api.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
        created.delete(id);
      }
      const snapDel = await target.api.request('DELETE', `/v1/snapshots/${snapshotId}`);
      assert.equal(snapDel.status, 204);
      const unknown = await cluster.api.json<ErrorBody>('POST', '/v1/cluster/nodes/nope/drain');
      assert.equal(unknown.status, 404);
      assert.equal(unknown.body.code, 'node_not_found');
      drainedNode = target.id;
    }));

  test('an undrain through another node returns the drained node to serving: a create asked of it is made there', () =>
    reported(async () => {
      assert.ok(drainedNode, 'the drain test ran first');
      const target = cluster.node(drainedNode);
      const seen = await undrainNode(cluster, target.id, { via: elsewhere(target.id) });
      assert.equal(seen.state, 'serving');
      assert.ok(seen.drain?.undrained_at, JSON.stringify(seen.drain));
      await eventually(
        `${target.id} to be listed serving by itself`,
        async () => (await nodeView(target.api, target.id))?.state === 'serving',
      );
      // It holds nothing (its sandboxes went), so it is the least loaded: a create asked of it
      // is made there, with no restart.
      const s = await create(target.api);
      assert.equal(s.node, target.id);
      assert.equal((await run(cluster.api, s.id, 'print(6 * 7)')).stdout, '42\n');
      assert.equal((await cluster.api.request('DELETE', `/v1/sandboxes/${s.id}`)).status, 204);
      created.delete(s.id);
    }));

  test('a node stopped with SIGTERM hands its sandboxes and snapshot over first; they serve meanwhile', () =>
    reported(async () => {
      const kept = sandboxes[0]!;
      const node = cluster.node(kept.node);
      const mine = sandboxes.filter((s) => s.node === node.id);
      const snap = await cluster.api.json<{ snapshot_id: string }>(
        'POST',
        `/v1/sandboxes/${kept.id}/snapshot`,
      );
      assert.equal(snap.status, 200, JSON.stringify(snap.body));
      assert.equal(await node.stop('SIGTERM'), 0);
      for (const s of mine) {
        const now = await info(cluster.api, s.id);
        assert.notEqual(now.node, node.id);
        assert.equal((await run(cluster.api, s.id, 'print(x)')).stdout, '41\n');
      }
      // Its snapshot too serves while it is down: handed over before it stopped.
      const fromSnap = await cluster.api.json<{ id: string }>('POST', '/v1/sandboxes', {
        snapshot: snap.body.snapshot_id,
      });
      assert.equal(fromSnap.status, 200, JSON.stringify(fromSnap.body));
      created.add(fromSnap.body.id);
      assert.equal((await run(cluster.api, fromSnap.body.id, 'print(x)')).stdout, '41\n');
      const del = await cluster.api.request('DELETE', `/v1/sandboxes/${fromSnap.body.id}`);
      assert.equal(del.status, 204);
      created.delete(fromSnap.body.id);
      const snapDel = await cluster.api.request('DELETE', `/v1/snapshots/${snap.body.snapshot_id}`);
      assert.equal(snapDel.status, 204);
      await node.start();
      await eventually(
        `${node.id} to serve again`,
        async () => {
          const v = await cluster.api.json<ClusterView>('GET', '/v1/cluster');
          return v.body.nodes?.find((n) => n.id === node.id)?.state === 'serving';
        },
        { timeoutMs: 120_000, everyMs: 200 },
      );
      sandboxes = await Promise.all(sandboxes.map((s) => info(cluster.api, s.id)));
    }));

  test('a create from a snapshot whose node drains is made on another node, which copies the snapshot; the drain then leaves it there', () =>
    reported(async () => {
      const source = sandboxes[1]!;
      const holder = cluster.node(source.node);
      const asker = cluster.nodes.find((n) => n.id !== holder.id && n.hostd)!;
      assert.equal((await run(holder.api, source.id, "z = 'copied'")).exit, 0);
      const snap = await holder.api.json<{ snapshot_id: string }>(
        'POST',
        `/v1/sandboxes/${source.id}/snapshot`,
      );
      assert.equal(snap.status, 200, JSON.stringify(snap.body));
      const snapshotId = snap.body.snapshot_id;
      // A busy sandbox holds the drain back (its hand-over waits for its turn): the holder is
      // draining, and still holds the snapshot, until the exec is cancelled.
      const busy = await openExec(holder.api, source.id, {
        code: 'import time\nwhile True: time.sleep(0.2)',
        timeout: 600,
      });
      assert.equal(busy.response.status, 200);
      let blocked = true;
      try {
        const drain = await asker.api.json<NodeView>(
          'POST',
          `/v1/cluster/nodes/${holder.id}/drain`,
        );
        assert.equal(drain.status, 202);
        await eventually(`${asker.id} to see ${holder.id} draining`, async () => {
          const v = await asker.api.json<ClusterView>('GET', '/v1/cluster');
          return v.body.nodes.find((x) => x.id === holder.id)?.state === 'draining';
        });
        // Its holder takes no creates: another node copies the snapshot and makes it.
        const made = await asker.api.json<{ id: string }>('POST', '/v1/sandboxes', {
          snapshot: snapshotId,
        });
        assert.equal(made.status, 200, JSON.stringify(made.body));
        created.add(made.body.id);
        const child = await info(cluster.api, made.body.id);
        assert.notEqual(child.node, holder.id);
        assert.equal(child.snapshot_id, snapshotId);
        assert.equal((await run(asker.api, child.id, 'print(x, z)')).stdout, '41 copied\n');
        busy.abort();
        blocked = false;
        await waitDrained(cluster, holder.id, {
          via: asker.api,
          since: drain.body.drain!.started_at,
          timeoutMs: 240_000,
          everyMs: 250,
        });
        // The drain left the snapshot to the node with the copy: a create from it through the
        // drained node is made there, with the REPL state.
        const again = await holder.api.json<{ id: string }>('POST', '/v1/sandboxes', {
          snapshot: snapshotId,
        });
        assert.equal(again.status, 200, JSON.stringify(again.body));
        created.add(again.body.id);
        assert.equal((await info(cluster.api, again.body.id)).node, child.node);
        assert.equal((await run(holder.api, again.body.id, 'print(z)')).stdout, 'copied\n');
        for (const id of [child.id, again.body.id]) {
          assert.equal((await cluster.api.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
          created.delete(id);
        }
        const listed = await cluster.api.json<{ snapshots: { snapshot_id: string }[] }>(
          'GET',
          '/v1/snapshots',
        );
        assert.equal(
          listed.body.snapshots.filter((x) => x.snapshot_id === snapshotId).length,
          1,
          'listed once',
        );
      } finally {
        if (blocked) busy.abort();
        await cluster.api.request('DELETE', `/v1/snapshots/${snapshotId}`);
      }
      // The drained node serves again after a restart, as a rolling restart does.
      await holder.stop('SIGTERM');
      await holder.start();
      await eventually(
        `${holder.id} to serve again`,
        async () => {
          const v = await cluster.api.json<ClusterView>('GET', '/v1/cluster');
          return v.body.nodes?.find((n) => n.id === holder.id)?.state === 'serving';
        },
        { timeoutMs: 120_000, everyMs: 200 },
      );
      sandboxes = await Promise.all(sandboxes.map((s) => info(cluster.api, s.id)));
    }));

  test("a SIGKILLed node's sandboxes answer 410 sandbox_lost naming it, and can be deleted", () =>
    reported(async () => {
      const victim = sandboxes[0]!;
      const node = cluster.node(victim.node);
      // A child on the same node (forks stay there), kept while the node is away: the next test
      // sees it re-adopted when the node is back.
      const fork = await cluster.api.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${victim.id}/fork`,
        { n: 1 },
      );
      assert.equal(fork.status, 200, JSON.stringify(fork.body));
      const child = await info(cluster.api, fork.body.children[0]!.id);
      created.add(child.id);
      assert.equal(child.node, victim.node);
      survivor = child;
      deletedWhileAway = victim.id;
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

  test('back after the SIGKILL, the node re-adopts what it kept and fences what was deleted', () =>
    reported(async () => {
      assert.ok(survivor, 'the SIGKILL test ran');
      const kept = survivor;
      const node = cluster.node(kept.node);
      await node.start();
      const asker = elsewhere(kept.node);
      // Re-adopted: its VM ran on while hostd was down; it serves again, REPL state intact,
      // through any node (its live key is back).
      await eventually(
        `${kept.id} to serve again after ${kept.node} came back`,
        async () => (await asker.json<Info>('GET', `/v1/sandboxes/${kept.id}`)).status === 200,
        { timeoutMs: 120_000, everyMs: 200 },
      );
      assert.equal((await info(asker, kept.id)).node, kept.node);
      assert.equal((await run(asker, kept.id, 'print(x)')).stdout, '41\n');
      // Fenced: deleted through another node while it was away, its local copy is destroyed.
      for (const n of cluster.nodes) {
        const res = await n.api.json<ErrorBody>('GET', `/v1/sandboxes/${deletedWhileAway}`);
        assert.equal(res.status, 404, `${deletedWhileAway} from ${n.id}`);
      }
      const own = await node.api.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes');
      assert.equal(
        own.body.sandboxes.some((s) => s.id === deletedWhileAway),
        false,
        'the fenced sandbox is in no list',
      );
      sandboxes.push(kept);
    }));

  test('with one etcd member down the cluster creates and runs code as before', () =>
    reported(async () => {
      const member = cluster.etcd[0]!;
      await member.stop();
      try {
        const s = await create(cluster.api);
        assert.equal((await run(elsewhere(s.node), s.id, 'print(6 * 7)')).stdout, '42\n');
        const del = await elsewhere(s.node).request('DELETE', `/v1/sandboxes/${s.id}`);
        assert.equal(del.status, 204);
        created.delete(s.id);
        // Every node's client is on the members left.
        await eventually(
          'every node to be connected to the members left',
          async () => {
            for (const n of cluster.nodes) {
              const v = await n.api.json<ClusterView>('GET', '/v1/cluster');
              if (!v.body.etcd.connected) return false;
            }
            return true;
          },
          { timeoutMs: 30_000, everyMs: 200 },
        );
      } finally {
        await member.start();
      }
    }));

  test('with etcd down, creates are refused with 503 and Retry-After; running sandboxes serve', () =>
    reported(async () => {
      await Promise.all(cluster.etcd.map((m) => m.stop()));
      try {
        await eventually(
          'every node to see etcd gone',
          async () => {
            for (const n of cluster.nodes) {
              const v = await n.api.json<ClusterView>('GET', '/v1/cluster');
              if (v.body.etcd.connected) return false;
            }
            return true;
          },
          { timeoutMs: 60_000, everyMs: 200 },
        );
        const refused = await cluster.api.request('POST', '/v1/sandboxes', {
          template: 'python-slim',
        });
        const refusal = (await refused.json()) as ErrorBody;
        assert.equal(refused.status, 503, JSON.stringify(refusal));
        assert.equal(refusal.code, 'cluster_unavailable');
        assert.ok(Number(refused.headers.get('retry-after')) > 0, 'Retry-After');
        const e2bRefused = await e2bFetch(cluster.nodes[0]!, 'POST', '/v2/sandboxes', {
          body: { templateID: 'python-slim' },
        });
        assert.equal(e2bRefused.status, 503);
        assert.equal(e2bRefused.json.error_code, 'cluster_unavailable');
        // Placed sandboxes serve on, on their node and forwarded to from the others.
        for (const s of sandboxes) {
          assert.equal((await run(cluster.node(s.node).api, s.id, 'print(x)')).stdout, '41\n');
          assert.equal((await run(elsewhere(s.node), s.id, 'print(x)')).stdout, '41\n');
        }
      } finally {
        await Promise.all(cluster.etcd.map((m) => m.start()));
      }
      // Back: creates are taken again, and nothing was lost.
      await eventually(
        'every node to reconnect to etcd',
        async () => {
          for (const n of cluster.nodes) {
            const v = await n.api.json<ClusterView>('GET', '/v1/cluster');
            if (!v.body.etcd.connected) return false;
          }
          return true;
        },
        { timeoutMs: 60_000, everyMs: 200 },
      );
      for (const s of sandboxes) {
        assert.equal((await run(elsewhere(s.node), s.id, 'print(x)')).stdout, '41\n');
      }
      const again = await create(cluster.api);
      const del = await cluster.api.request('DELETE', `/v1/sandboxes/${again.id}`);
      assert.equal(del.status, 204);
      created.delete(again.id);
    }));

  test('a rolling restart of the three nodes, one at a time, loses no sandbox and no REPL state', () =>
    reported(async () => {
      assert.ok(sandboxes.length > 0);
      for (const node of cluster.nodes) {
        // SIGTERM drains: the node's sandboxes go to the others and serve there meanwhile.
        assert.equal(await node.stop('SIGTERM'), 0);
        for (const s of sandboxes) {
          const now = await info(cluster.api, s.id);
          assert.notEqual(now.node, node.id, `${s.id} left on the stopped node`);
          assert.equal((await run(cluster.api, s.id, 'print(x)')).stdout, '41\n');
        }
        const during = await create(cluster.api);
        assert.notEqual(during.node, node.id);
        assert.equal(
          (await cluster.api.request('DELETE', `/v1/sandboxes/${during.id}`)).status,
          204,
        );
        created.delete(during.id);
        await node.start();
        await eventually(
          `${node.id} to serve again`,
          async () => {
            const v = await cluster.api.json<ClusterView>('GET', '/v1/cluster');
            return v.body.nodes?.find((n) => n.id === node.id)?.state === 'serving';
          },
          { timeoutMs: 120_000, everyMs: 200 },
        );
      }
      const list = await cluster.api.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes');
      for (const s of sandboxes) {
        assert.ok(
          list.body.sandboxes.some((x) => x.id === s.id),
          `${s.id} listed`,
        );
        assert.equal((await run(cluster.api, s.id, 'print(x)')).stdout, '41\n');
      }
    }));
});
