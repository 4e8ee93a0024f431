/**
 * The E2B front in cluster mode (api/e2b/cluster-hop.ts), without VMs: two nodes on one
 * in-memory store, each a SandboxManager on the fake hypervisor with its native API and its E2B
 * front on loopback. A create asked of either front is placed as a native one is, and every
 * request naming a sandbox (its control-plane path, its `E2b-Sandbox-Id`) is answered by the
 * front of the node holding it, with that node's tokens and errors. Which requests name what is
 * pure logic, checked first. The same paths with real VMs and E2B's SDKs are in
 * test/integration/cluster.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { SandboxTokens } from '../../src/api/e2b/auth.js';
import { AUTO_RESUME_LABEL } from '../../src/api/e2b/context.js';
import { e2bSubject, e2bTarget, peerE2bUrl } from '../../src/api/e2b/cluster-hop.js';
import { fileSignature } from '../../src/api/e2b/envd-files.js';
import { e2bErrorBody } from '../../src/api/e2b/errors.js';
import { buildE2bServer } from '../../src/api/e2b/server.js';
import type { NodeRecord } from '../../src/core/cluster/records.js';
import { fail } from '../../src/errors.js';
import type { ManagerOptions } from '../../src/core/sandbox-manager.js';
import { untilNodesMeet } from '../helpers/cluster-manager.js';
import {
  execStdout,
  startServedNode,
  stopServedNodes,
  type ServedNode,
} from '../helpers/cluster-server.js';
import { FakeImages, plan } from '../helpers/fake-images.js';
import { MemoryStore } from '../helpers/memory-kv.js';
import { eventually } from '../../testkit/eventually.js';

const KEY = 'e2b-cluster-key';
const CLUSTER_KEY = 'e2b-cluster-secret';
const log = pino({ level: 'silent' });

describe('which node answers an E2B request', () => {
  const sbx = `sbx_${'1'.repeat(32)}`;

  test('control-plane routes name their sandbox in the path; a kill is a delete', () => {
    assert.deepEqual(e2bSubject('control', 'GET', '/sandboxes/:id', { id: sbx }, undefined), {
      kind: 'sandbox',
      id: sbx,
      isDelete: false,
    });
    assert.deepEqual(e2bSubject('control', 'DELETE', '/sandboxes/:id', { id: sbx }, undefined), {
      kind: 'sandbox',
      id: sbx,
      isDelete: true,
    });
    assert.deepEqual(
      e2bSubject('control', 'POST', '/v2/sandboxes/:id/connect', { id: sbx }, undefined),
      { kind: 'sandbox', id: sbx, isDelete: false },
    );
    assert.deepEqual(
      e2bSubject('control', 'DELETE', '/templates/:id', { id: 'snap_1' }, undefined),
      { kind: 'snapshot', id: 'snap_1' },
    );
  });

  test('creates, lists and templates name nothing: the node that got them answers', () => {
    assert.equal(e2bSubject('control', 'POST', '/v2/sandboxes', {}, undefined), null);
    assert.equal(e2bSubject('control', 'GET', '/v2/sandboxes', {}, undefined), null);
    assert.equal(e2bSubject('control', 'GET', '/snapshots', {}, undefined), null);
    assert.equal(
      e2bSubject('control', 'DELETE', '/templates/:id', { id: 'base' }, undefined),
      null,
    );
    assert.equal(e2bSubject('control', 'GET', undefined, {}, undefined), null);
  });

  test('sandbox traffic names its sandbox in E2b-Sandbox-Id; signed URLs carry none', () => {
    assert.deepEqual(e2bSubject('data', 'POST', '/execute', {}, sbx), {
      kind: 'sandbox',
      id: sbx,
      isDelete: false,
    });
    assert.equal(e2bSubject('data', 'GET', '/files', {}, undefined), null);
    assert.equal(e2bSubject('data', 'GET', '/files', {}, ''), null);
  });

  test("a node's E2B front: its record's e2b_url, its address unless it binds every one", () => {
    const rec = { id: 'n1', url: 'http://10.0.0.1:7070' } as NodeRecord;
    assert.equal(e2bTarget(rec), null);
    assert.deepEqual(e2bTarget({ ...rec, e2b_url: 'http://10.0.0.1:49982' }), {
      id: 'n1',
      url: 'http://10.0.0.1:49982',
    });
    assert.equal(
      peerE2bUrl('http://127.0.0.2:41000', 'http://127.0.0.2:7070'),
      'http://127.0.0.2:41000',
    );
    assert.equal(
      peerE2bUrl('http://0.0.0.0:49982', 'http://10.0.0.1:7070'),
      'http://10.0.0.1:49982',
    );
    assert.equal(peerE2bUrl('http://[::]:49982', 'http://host-a:7070'), 'http://host-a:49982');
  });
});

/** A node served on loopback (test/helpers/cluster-server.ts) with its E2B front. */
type Node = ServedNode & { e2b: FastifyInstance; e2bUrl: string };

/** Each node's data directory: where its own token secret, and its copy of the cluster's, are. */
const dataDirs: string[] = [];
after(async () => {
  for (const dir of dataDirs) await rm(dir, { recursive: true, force: true });
});

async function startNode(
  store: MemoryStore,
  id: string,
  overrides: Partial<ManagerOptions> = {},
): Promise<Node> {
  const dataDir = await mkdtemp(join(tmpdir(), `e2b-cluster-${id}-`));
  dataDirs.push(dataDir);
  let front: { e2b: FastifyInstance; e2bUrl: string } | null = null;
  // The peer routes and links, for snapshots copied to the node a create is placed on.
  const node = await startServedNode(store, id, {
    apiKey: KEY,
    clusterKey: CLUSTER_KEY,
    log,
    overrides,
    beforeStart: async ({ cluster, manager, handOver }) => {
      const { app: e2b } = await buildE2bServer({
        manager,
        auth: { kind: 'keys', keys: [KEY] },
        // As hostd's: each node's own secret, and the cluster's, which new tokens are issued under.
        tokens: await SandboxTokens.ofClusterNode(dataDir, cluster, log),
        maxBodyBytes: 1 << 20,
        maxFileBytes: 1 << 20,
        logger: log,
        cluster,
        room: {
          pausedWithoutRoom: (sandbox) => manager.pausedWithoutRoom(sandbox),
          moveToRoom: (sandbox, template) => handOver.moveToRoom(sandbox, template),
        },
      });
      const e2bUrl = await e2b.listen({ host: '127.0.0.1', port: 0 });
      cluster.e2bUrl = e2bUrl;
      front = { e2b, e2bUrl };
    },
  });
  return { ...node, ...front! };
}

/** Closes each node's E2B front, then the node. */
async function stopNodes(...nodes: (Node | undefined)[]): Promise<void> {
  for (const n of nodes) {
    if (!n) continue;
    await n.e2b.close();
    await stopServedNodes(n);
  }
}

async function e2b(
  node: Node,
  method: string,
  path: string,
  opts: { body?: unknown; headers?: Record<string, string> } = {},
): Promise<{ status: number; headers: Headers; json: unknown }> {
  const res = await fetch(node.e2bUrl + path, {
    method,
    headers: {
      'x-api-key': KEY,
      ...(opts.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...opts.headers,
    },
    ...(opts.body !== undefined ? { body: JSON.stringify(opts.body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, json: text ? JSON.parse(text) : null };
}

type Made = { sandboxID: string; envdAccessToken: string };

describe('the E2B front of a two-node cluster', () => {
  const store = new MemoryStore();
  let a: Node;
  let b: Node;

  before(async () => {
    a = await startNode(store, 'a');
    b = await startNode(store, 'b');
    await untilNodesMeet([a.cluster, b.cluster], (r) => Boolean(r.e2b_url));
  });

  after(() => stopNodes(a, b));

  test('a create of a draining node is placed on the other, whose front answers it', async () => {
    await a.cluster.setState('draining');
    await b.cluster.view.waitFor(
      () => (b.cluster.view.nodes.get('a')?.state === 'draining' ? true : null),
      5000,
    );
    try {
      const made = await e2b(a, 'POST', '/v2/sandboxes', { body: { templateID: 'python' } });
      assert.equal(made.status, 201, JSON.stringify(made.json));
      const { sandboxID } = made.json as Made;
      assert.equal(b.manager.holds(sandboxID), true);
      assert.equal(a.manager.holds(sandboxID), false);
      assert.equal((await e2b(a, 'DELETE', `/sandboxes/${sandboxID}`)).status, 204);
      assert.equal(b.manager.holds(sandboxID), false);
    } finally {
      await a.cluster.setState('serving');
      await b.cluster.view.waitFor(
        () => (b.cluster.view.nodes.get('a')?.state === 'serving' ? true : null),
        5000,
      );
    }
  });

  test('a create of a template no node serves is 404 template_not_found, as a single hostd answers it', async () => {
    for (const via of [a, b]) {
      const res = await e2b(via, 'POST', '/v2/sandboxes', { body: { templateID: 'perl' } });
      assert.equal(res.status, 404, `via ${via.id}: ${JSON.stringify(res.json)}`);
      assert.deepEqual(
        res.json,
        e2bErrorBody(fail('templateNotFound', 'perl', ['python', 'slim'])),
        `via ${via.id}`,
      );
    }
  });

  test("a create from a snapshot named by its name goes to the snapshot's node, however loaded", async () => {
    // The snapshot is a's, and a is the busier node: placement alone would pick b.
    const source = await a.manager.create({ template: 'python' });
    const busy = await a.manager.create({ template: 'python' });
    const snap = await e2b(b, 'POST', `/sandboxes/${source.id}/snapshots`, {
      body: { name: 'pinned-ckpt' },
    });
    assert.equal(snap.status, 201, JSON.stringify(snap.json));
    const { snapshotID } = snap.json as { snapshotID: string };
    assert.equal(a.manager.holdsSnapshot(snapshotID), true);
    await b.cluster.view.waitFor(
      () => (b.cluster.view.snapshots.has(snapshotID) ? true : null),
      5000,
    );
    const made: string[] = [];
    try {
      for (const [via, templateID] of [
        [b, 'pinned-ckpt'],
        [b, 'pinned-ckpt:latest'],
        [a, 'pinned-ckpt'],
        [b, snapshotID],
      ] as const) {
        const res = await e2b(via, 'POST', '/v2/sandboxes', { body: { templateID } });
        assert.equal(res.status, 201, `${templateID} via ${via.id}: ${JSON.stringify(res.json)}`);
        const { sandboxID, templateID: answered } = res.json as Made & { templateID: string };
        made.push(sandboxID);
        assert.equal(a.manager.holds(sandboxID), true, `${templateID} via ${via.id} is on a`);
        assert.equal(a.manager.describe(sandboxID).snapshot_id, snapshotID);
        assert.equal(answered, templateID);
      }
    } finally {
      for (const id of [...made, source.id, busy.id]) await e2b(b, 'DELETE', `/sandboxes/${id}`);
      await e2b(b, 'DELETE', `/templates/${snapshotID}`);
    }
  });

  test("a create by a snapshot's name whose node drains is made on another node, which copies the snapshot", async () => {
    const source = await a.manager.create({ template: 'python' });
    const snap = await e2b(a, 'POST', `/sandboxes/${source.id}/snapshots`, {
      body: { name: 'spill-ckpt' },
    });
    assert.equal(snap.status, 201, JSON.stringify(snap.json));
    const { snapshotID } = snap.json as { snapshotID: string };
    await b.cluster.view.waitFor(
      () => (b.cluster.view.snapshots.has(snapshotID) ? true : null),
      5000,
    );
    await a.cluster.setState('draining');
    const made: string[] = [];
    try {
      for (const via of [a, b]) {
        const res = await e2b(via, 'POST', '/v2/sandboxes', { body: { templateID: 'spill-ckpt' } });
        assert.equal(res.status, 201, `via ${via.id}: ${JSON.stringify(res.json)}`);
        const { sandboxID, templateID } = res.json as Made & { templateID: string };
        made.push(sandboxID);
        assert.equal(b.manager.holds(sandboxID), true, `via ${via.id}: made on b`);
        assert.equal(b.manager.describe(sandboxID).snapshot_id, snapshotID);
        assert.equal(templateID, 'spill-ckpt');
      }
      assert.equal(b.manager.holdsSnapshot(snapshotID), true);
      // Listed once, whichever node is asked.
      for (const via of [a, b]) {
        const list = await e2b(via, 'GET', '/snapshots?name=spill-ckpt');
        assert.deepEqual(
          (list.json as { snapshotID: string }[]).map((s) => s.snapshotID),
          [snapshotID],
        );
      }
    } finally {
      await a.cluster.setState('serving');
      for (const id of [...made, source.id]) await e2b(b, 'DELETE', `/sandboxes/${id}`);
      // Deleted through the node holding a copy: gone from both.
      assert.equal((await e2b(b, 'DELETE', `/templates/${snapshotID}`)).status, 204);
    }
    assert.equal(a.manager.holdsSnapshot(snapshotID), false);
    await eventually('b to drop its copy', () => !b.manager.holdsSnapshot(snapshotID));
  });

  test("a create by a snapshot's name is made of the snapshot the receiving node resolved, whatever the holder's copy knows", async () => {
    const source = await a.manager.create({ template: 'python' });
    const snap = await e2b(a, 'POST', `/sandboxes/${source.id}/snapshots`, {
      body: { name: 'race-ckpt' },
    });
    assert.equal(snap.status, 201, JSON.stringify(snap.json));
    const { snapshotID } = snap.json as { snapshotID: string };
    await b.cluster.view.waitFor(
      () => (b.cluster.view.snapshots.has(snapshotID) ? true : null),
      5000,
    );
    // a's copy has a newer snapshot of that name, on a third node that is down; b's does not.
    const ghost = `snap_${'f'.repeat(32)}`;
    a.cluster.view.snapshots.set(ghost, {
      value: {
        node: 'c',
        name: 'race-ckpt',
        template: 'python',
        source_sandbox_id: source.id,
        size_bytes: 1,
        created_at: new Date(Date.now() + 60_000).toISOString(),
      },
      modRevision: 1,
    });
    let made: string | null = null;
    try {
      const res = await e2b(b, 'POST', '/v2/sandboxes', { body: { templateID: 'race-ckpt' } });
      assert.equal(res.status, 201, JSON.stringify(res.json));
      const answer = res.json as Made & { templateID: string; alias?: string };
      made = answer.sandboxID;
      assert.equal(a.manager.describe(made).snapshot_id, snapshotID);
      // It names what the client asked for, as a create made where it was asked does.
      assert.equal(answer.templateID, 'race-ckpt');
      assert.equal(answer.alias, undefined);
    } finally {
      a.cluster.view.snapshots.delete(ghost);
      for (const id of [...(made ? [made] : []), source.id])
        await e2b(a, 'DELETE', `/sandboxes/${id}`);
      await e2b(a, 'DELETE', `/templates/${snapshotID}`);
    }
  });

  test("a snapshot's name works through a node whose copy of the catalog has not caught up yet", async () => {
    const source = await a.manager.create({ template: 'python' });
    const snap = await e2b(a, 'POST', `/sandboxes/${source.id}/snapshots`, {
      body: { name: 'fresh-ckpt' },
    });
    assert.equal(snap.status, 201, JSON.stringify(snap.json));
    const { snapshotID } = snap.json as { snapshotID: string };
    // b's watch lags: its copy does not have the entry the store has.
    await b.cluster.view.waitFor(
      () => (b.cluster.view.snapshots.has(snapshotID) ? true : null),
      5000,
    );
    b.cluster.view.snapshots.delete(snapshotID);
    let made: string | null = null;
    try {
      const res = await e2b(b, 'POST', '/v2/sandboxes', { body: { templateID: 'fresh-ckpt' } });
      assert.equal(res.status, 201, JSON.stringify(res.json));
      made = (res.json as Made).sandboxID;
      assert.equal(a.manager.describe(made).snapshot_id, snapshotID);
    } finally {
      for (const id of [...(made ? [made] : []), source.id])
        await e2b(a, 'DELETE', `/sandboxes/${id}`);
      await e2b(a, 'DELETE', `/templates/${snapshotID}`);
    }
  });

  test('the batch metrics answer every sandbox named, each from its node, in the order asked', async () => {
    const onA = [await a.manager.create({ template: 'python' })];
    const onB = [
      await b.manager.create({ template: 'python' }),
      await b.manager.create({ template: 'python' }),
    ];
    const all = [onB[0]!, onA[0]!, onB[1]!];
    try {
      // Each holder samples its sandboxes on its 5 s marks.
      await eventually('a sample of every sandbox', () =>
        all.every((s) => (a.manager.holds(s.id) ? a : b).manager.metrics(s.id).length > 0),
      );
      const ids = all.map((s) => s.id);
      for (const via of [a, b]) {
        const res = await e2b(via, 'GET', `/sandboxes/metrics?sandbox_ids=${ids.join(',')}`);
        assert.equal(res.status, 200, JSON.stringify(res.json));
        const got = (res.json as { sandboxes: Record<string, { timestampUnix: number }> })
          .sandboxes;
        assert.deepEqual(Object.keys(got), ids, `via ${via.id}: every id, in request order`);
        for (const id of ids) {
          const holder = a.manager.holds(id) ? a : b;
          const last = holder.manager.metrics(id).at(-1)!;
          assert.ok(got[id]!.timestampUnix >= Math.round(last.timestamp / 1000) - 5, id);
        }
      }
      // As on a single hostd, an id no node holds fails the whole request (404), through
      // either node, wherever it stands in the list.
      const unknown = `sbx_${'f'.repeat(32)}`;
      for (const via of [a, b]) {
        const res = await e2b(
          via,
          'GET',
          `/sandboxes/metrics?sandbox_ids=${ids[0]},${unknown},${ids[1]}`,
        );
        assert.equal(res.status, 404, `via ${via.id}: ${JSON.stringify(res.json)}`);
      }
      // When ids fail on two nodes, the answer is the first failing id's in request order, even
      // where its node's part comes after the part of a node that holds an earlier id.
      const ghost = `sbx_${'e'.repeat(32)}`; // b's in a's copy of the catalog; b holds no such
      a.cluster.view.sandboxes.set(ghost, {
        value: {
          node: 'b',
          state: 'paused',
          template: 'python',
          parent: null,
          snapshot: null,
          created_at: new Date().toISOString(),
        },
        modRevision: 1,
      });
      try {
        const onAFirst = onA[0]!.id;
        const res = await e2b(
          a,
          'GET',
          `/sandboxes/metrics?sandbox_ids=${onAFirst},${ghost},${unknown}`,
        );
        assert.equal(res.status, 404, JSON.stringify(res.json));
        assert.match((res.json as { message: string }).message, new RegExp(ghost));
      } finally {
        a.cluster.view.sandboxes.delete(ghost);
      }
    } finally {
      for (const s of all) await e2b(a, 'DELETE', `/sandboxes/${s.id}`);
    }
  });

  test("any node's front serves a sandbox of the other: control plane, traffic, errors", async () => {
    const made = await e2b(b, 'POST', '/v2/sandboxes', {
      body: { templateID: 'python', metadata: { who: 'hop' } },
    });
    assert.equal(made.status, 201, JSON.stringify(made.json));
    const { sandboxID: id, envdAccessToken: token } = made.json as Made;
    const holder = a.manager.holds(id) ? a : b;
    const other = holder === a ? b : a;

    const info = await e2b(other, 'GET', `/sandboxes/${id}`);
    assert.equal(info.status, 200, JSON.stringify(info.json));
    assert.equal((info.json as { envdAccessToken: string }).envdAccessToken, token);
    assert.deepEqual((info.json as { metadata: unknown }).metadata, { who: 'hop' });

    for (const n of [a, b]) {
      const list = await e2b(n, 'GET', '/v2/sandboxes?metadata=who%3Dhop');
      assert.deepEqual(
        (list.json as { sandboxID: string }[]).map((s) => s.sandboxID),
        [id],
        `listed by ${n.id}`,
      );
      const legacy = await e2b(n, 'GET', '/sandboxes?metadata=who%3Dhop');
      assert.deepEqual(
        (legacy.json as { sandboxID: string }[]).map((s) => s.sandboxID),
        [id],
      );
    }

    // Sandbox traffic: the holder checks the token it issued.
    const health = await e2b(other, 'GET', '/health', {
      headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983' },
    });
    assert.equal(health.status, 204);
    const denied = await e2b(other, 'GET', '/files?path=/tmp/x', {
      headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', 'x-access-token': 'nope' },
    });
    assert.equal(denied.status, 401);
    assert.equal((denied.json as { code: number }).code, 401);
    const rpc = await e2b(other, 'POST', '/filesystem.Filesystem/Stat', {
      body: { path: '/definitely/missing' },
      headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', 'x-access-token': token },
    });
    assert.equal(rpc.status, 404, JSON.stringify(rpc.json));
    assert.equal((rpc.json as { code: string }).code, 'not_found');

    // Signed URLs (uploadUrl, downloadUrl) name no sandbox: the node whose sandbox the signature
    // is for answers them, whichever node they reach.
    const path = '/tmp/signed.txt';
    const signed = (op: 'read' | 'write'): string =>
      `/files?path=${encodeURIComponent(path)}&username=user&signature=${encodeURIComponent(
        fileSignature(path, op, 'user', token),
      )}`;
    const up = await fetch(other.e2bUrl + signed('write'), {
      method: 'POST',
      headers: { 'content-type': 'application/octet-stream' },
      body: 'signed and forwarded',
    });
    assert.equal(up.status, 200, await up.clone().text());
    const down = await fetch(other.e2bUrl + signed('read'));
    assert.equal(down.status, 200);
    assert.equal(await down.text(), 'signed and forwarded');
    const forged = await fetch(
      other.e2bUrl + signed('read').replace(/signature=[^&]+/, 'signature=v1_x'),
    );
    assert.equal(forged.status, 401);
    // The node it is for answers an expired one, in envd's words.
    const past = Math.floor(Date.now() / 1000) - 60;
    const expired = await fetch(
      `${other.e2bUrl}/files?path=${encodeURIComponent(path)}&username=user&signature=${encodeURIComponent(
        fileSignature(path, 'read', 'user', token, past),
      )}&signature_expiration=${past}`,
    );
    assert.deepEqual(
      [expired.status, await expired.json()],
      [401, { code: 401, message: 'signature is already expired' }],
    );

    // The control plane's key is checked before anything is looked up or forwarded.
    const noKey = await fetch(`${other.e2bUrl}/sandboxes/${id}`, {
      headers: { 'x-api-key': 'wrong' },
    });
    assert.equal(noKey.status, 401);

    const kill = await e2b(other, 'DELETE', `/sandboxes/${id}`);
    assert.equal(kill.status, 204);
    assert.equal(holder.manager.holds(id), false);
    const again = await e2b(other, 'DELETE', `/sandboxes/${id}`);
    assert.equal(again.status, 404);
    const gone = await e2b(other, 'GET', '/health', {
      headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983' },
    });
    assert.equal(gone.status, 502);
  });
});

describe('the batch metrics of a cluster with a node gone', () => {
  const store = new MemoryStore();
  let c: Node;
  let d: Node;

  before(async () => {
    c = await startNode(store, 'c');
    d = await startNode(store, 'd');
    await untilNodesMeet([c.cluster, d.cluster], (r) => Boolean(r.e2b_url));
  });

  after(() => stopNodes(c, d));

  test('an id lost with its node fails the request as a lost sandbox does alone (404 sandbox_lost)', async () => {
    const here = await c.manager.create({ template: 'python' });
    const there = await d.manager.create({ template: 'python' });
    await c.cluster.view.waitFor(() => (c.cluster.view.live.has(there.id) ? true : null), 5000);
    // d stops answering for the cluster: its lease, and with it its live keys, go.
    await d.cluster.stop();
    await eventually('c to see d gone', () => !c.cluster.view.nodes.has('d'));
    const res = await e2b(c, 'GET', `/sandboxes/metrics?sandbox_ids=${here.id},${there.id}`);
    assert.equal(res.status, 404, JSON.stringify(res.json));
    assert.equal((res.json as { error_code: string }).error_code, 'sandbox_lost');
    assert.match((res.json as { message: string }).message, /node d/);
    const alone = await e2b(c, 'GET', `/sandboxes/${there.id}/metrics`);
    assert.deepEqual(
      [alone.status, (alone.json as { error_code: string }).error_code],
      [404, 'sandbox_lost'],
    );
  });
});

describe("E2B's template aliases in a cluster whose nodes serve different templates", () => {
  const store = new MemoryStore();
  let e: Node;
  let f: Node;

  before(async () => {
    // e serves slim only; f serves python (what `base` and `code-interpreter-v1` map onto).
    e = await startNode(store, 'e', {
      templates: [plan('slim', { poolSize: 0 })],
      images: new FakeImages(['slim']),
    });
    f = await startNode(store, 'f');
    await untilNodesMeet([e.cluster, f.cluster], (r) => Boolean(r.e2b_url));
    await eventually('e to see python ready on f', () => {
      return e.cluster.view.nodes.get('f')?.templates.python?.state === 'ready';
    });
  });

  after(() => stopNodes(e, f));

  test('an alias maps onto the template any live node serves, and the create is made there', async () => {
    for (const alias of ['base', 'code-interpreter-v1']) {
      const res = await e2b(e, 'POST', '/v2/sandboxes', { body: { templateID: alias } });
      assert.equal(res.status, 201, `${alias}: ${JSON.stringify(res.json)}`);
      const answer = res.json as Made & { templateID: string; alias?: string };
      assert.equal(f.manager.holds(answer.sandboxID), true, `${alias} is made on f`);
      assert.equal(f.manager.describe(answer.sandboxID).template, 'python');
      assert.deepEqual([answer.templateID, answer.alias], [alias, alias]);
      assert.equal((await e2b(e, 'DELETE', `/sandboxes/${answer.sandboxID}`)).status, 204);
    }
  });
});

describe("E2B's connect of a paused sandbox whose node is full", () => {
  const store = new MemoryStore();
  let g: Node;
  let h: Node;

  /** What `code` prints on sandbox `id`, asked of `via`'s native API. */
  const stdout = (via: Node, id: string, code: string): Promise<string> =>
    execStdout(via.api, id, code);

  before(async () => {
    // g takes one sandbox at most: one running there makes it full.
    g = await startNode(store, 'g', { maxSandboxes: 1 });
    h = await startNode(store, 'h');
    await untilNodesMeet([g.cluster, h.cluster], (r) => Boolean(r.e2b_url));
  });

  after(() => stopNodes(g, h));

  test('moves it to a node with room first, asked of that node or of its own, and resumes it there', async () => {
    const paused: string[] = [];
    for (const value of [3, 4]) {
      const s = await g.manager.create({ template: 'python' });
      paused.push(s.id);
      assert.equal(await stdout(g, s.id, `set x ${value}`), '');
      await g.manager.pause(s.id);
    }
    const [viaOther, viaHolder] = paused as [string, string];
    const filler = await g.manager.create({ template: 'python' });
    try {
      // g is full: E2B's connect asked of h, and the older resume asked of g itself.
      for (const [id, via, path, value] of [
        [viaOther, h, `/sandboxes/${viaOther}/connect`, '3'],
        [viaHolder, g, `/sandboxes/${viaHolder}/resume`, '4'],
      ] as const) {
        const res = await e2b(via, 'POST', path, { body: { timeout: 60 } });
        assert.equal(res.status, 201, JSON.stringify(res.json));
        assert.equal((res.json as Made).sandboxID, id);
        assert.equal(g.manager.holds(id), false, `${id} left g`);
        assert.equal(h.manager.describe(id).state, 'ready');
        // The answer is h's: its token opens the sandbox's traffic there.
        const token = (res.json as Made).envdAccessToken;
        const rpc = await e2b(g, 'POST', '/filesystem.Filesystem/Stat', {
          body: { path: '/definitely/missing' },
          headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', 'x-access-token': token },
        });
        assert.equal(rpc.status, 404, JSON.stringify(rpc.json));
        assert.equal(await stdout(g, id, 'get x'), value);
      }
    } finally {
      await g.manager.delete(filler.id);
      for (const id of paused) await e2b(g, 'DELETE', `/sandboxes/${id}`);
    }
  });

  test('its envd traffic (autoResume) moves it to a node with room first, asked of either node, and resumes it there', async () => {
    const moving: string[] = [];
    for (const value of [5, 6]) {
      const s = await g.manager.create({
        template: 'python',
        metadata: { [AUTO_RESUME_LABEL]: 'true' },
      });
      moving.push(s.id);
      assert.equal(await stdout(g, s.id, `set x ${value}`), '');
      await g.manager.pause(s.id);
    }
    // Paused by the client without autoResume: E2B's traffic is refused (502), and nothing moves.
    const stays = await g.manager.create({ template: 'python' });
    await g.manager.pause(stays.id);
    const filler = await g.manager.create({ template: 'python' });
    const token = async (id: string): Promise<string> =>
      ((await e2b(g, 'GET', `/sandboxes/${id}`)).json as Made).envdAccessToken;
    try {
      const stayToken = await token(stays.id);
      const tokens = [await token(moving[0]!), await token(moving[1]!)];
      // g is full: traffic asked of g itself, and of h (passed to g, which moves it to h).
      for (const [i, via] of [g, h].entries()) {
        const id = moving[i]!;
        const rpc = await e2b(via, 'POST', '/filesystem.Filesystem/Stat', {
          body: { path: '/definitely/missing' },
          headers: {
            'e2b-sandbox-id': id,
            'e2b-sandbox-port': '49983',
            'x-access-token': tokens[i]!,
          },
        });
        assert.equal(rpc.status, 404, `via ${via.id}: ${JSON.stringify(rpc.json)}`);
        assert.equal((rpc.json as { code: string }).code, 'not_found');
        assert.equal(g.manager.holds(id), false, `${id} left g`);
        assert.equal(h.manager.describe(id).state, 'ready');
        assert.equal(await stdout(g, id, 'get x'), String(5 + i));
      }
      const refused = await e2b(g, 'POST', '/filesystem.Filesystem/Stat', {
        body: { path: '/definitely/missing' },
        headers: {
          'e2b-sandbox-id': stays.id,
          'e2b-sandbox-port': '49983',
          'x-access-token': stayToken,
        },
      });
      assert.equal(refused.status, 502, JSON.stringify(refused.json));
      assert.equal(g.manager.holds(stays.id), true);
      assert.equal(g.manager.describe(stays.id).state, 'paused');
    } finally {
      await g.manager.delete(filler.id);
      for (const id of [...moving, stays.id]) await e2b(g, 'DELETE', `/sandboxes/${id}`);
    }
  });

  test("a token issued by the sandbox's old node opens its traffic on the node it was moved to", async () => {
    const s = await g.manager.create({ template: 'python' });
    try {
      const info = await e2b(g, 'GET', `/sandboxes/${s.id}`);
      assert.equal(info.status, 200, JSON.stringify(info.json));
      const token = (info.json as Made).envdAccessToken;
      // As a drain does: paused, handed over, resumed on its next use on h.
      await g.manager.pause(s.id);
      await g.handOver.moveOut(s.id, h.cluster.selfRecord());
      assert.equal(h.manager.holds(s.id), true);
      assert.equal(g.manager.holds(s.id), false);
      await h.manager.resume(s.id);
      for (const via of [g, h]) {
        const rpc = await e2b(via, 'POST', '/filesystem.Filesystem/Stat', {
          body: { path: '/definitely/missing' },
          headers: { 'e2b-sandbox-id': s.id, 'e2b-sandbox-port': '49983', 'x-access-token': token },
        });
        assert.equal(rpc.status, 404, `via ${via.id}: ${JSON.stringify(rpc.json)}`);
        assert.equal((rpc.json as { code: string }).code, 'not_found');
      }
      // h's answers name the same token: the client's holds on.
      const again = await e2b(h, 'GET', `/sandboxes/${s.id}`);
      assert.equal((again.json as Made).envdAccessToken, token);
      const wrong = await e2b(h, 'POST', '/filesystem.Filesystem/Stat', {
        body: { path: '/definitely/missing' },
        headers: { 'e2b-sandbox-id': s.id, 'e2b-sandbox-port': '49983', 'x-access-token': 'nope' },
      });
      assert.equal(wrong.status, 401);
    } finally {
      await e2b(h, 'DELETE', `/sandboxes/${s.id}`);
    }
  });

  test('a connect with a wrong key is refused where it is asked, and moves nothing', async () => {
    const s = await g.manager.create({ template: 'python' });
    await g.manager.pause(s.id);
    const filler = await g.manager.create({ template: 'python' });
    try {
      for (const via of [g, h]) {
        const res = await fetch(`${via.e2bUrl}/sandboxes/${s.id}/connect`, {
          method: 'POST',
          headers: { 'x-api-key': 'wrong', 'content-type': 'application/json' },
          body: '{}',
        });
        assert.equal(res.status, 401);
        assert.equal(g.manager.holds(s.id), true);
        assert.equal(g.manager.describe(s.id).state, 'paused');
      }
    } finally {
      await g.manager.delete(filler.id);
      await g.manager.delete(s.id);
    }
  });
});
