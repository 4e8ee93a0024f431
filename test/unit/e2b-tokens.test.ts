/**
 * E2B's per-sandbox tokens (api/e2b/auth.ts) alone and in cluster mode, over the in-memory
 * store (test/helpers/memory-kv.ts): a single hostd issues and accepts tokens of its own secret
 * only, as it always has; cluster nodes issue under the one secret they share in the store, so a
 * token opens its sandbox on any node, and each still accepts tokens of its own secret. How the
 * fronts use them after a move is in test/unit/e2b-cluster.test.ts.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { E2B_TOKEN_SECRET, SandboxTokens } from '../../src/api/e2b/auth.js';
import { ClusterNode } from '../../src/core/cluster/cluster-node.js';
import { sharedSecret, sharedSecretKey } from '../../src/core/cluster/shared-secret.js';
import { eventually } from '../../testkit/eventually.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });
const sbx = `sbx_${'a'.repeat(32)}`;
const dirs: string[] = [];

async function dataDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'e2b-tokens-'));
  dirs.push(dir);
  return dir;
}

function nodeOf(store: MemoryStore, id: string): ClusterNode {
  return new ClusterNode(store.client(), { id, url: '', version: '0', ttlS: 10, log });
}

after(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('a single hostd', () => {
  test("issues and accepts its own secret's tokens only, the same after a restart", async () => {
    const dir = await dataDir();
    const file = join(dir, 'e2b-token-secret');
    const first = await SandboxTokens.load(file);
    const again = await SandboxTokens.load(file);
    assert.equal((await stat(file)).mode & 0o777, 0o600);
    assert.equal(again.accessToken(sbx), first.accessToken(sbx));
    assert.deepEqual(first.accessTokens(sbx), [first.accessToken(sbx)]);
    assert.equal(again.isAccessToken(sbx, first.accessToken(sbx)), true);
    assert.equal(again.isTrafficToken(sbx, first.trafficToken(sbx)), true);
    assert.equal(again.isAccessToken(sbx, first.trafficToken(sbx)), false);
    const other = `sbx_${'b'.repeat(32)}`;
    assert.equal(again.isAccessToken(other, first.accessToken(sbx)), false);
    // Another host's secret opens nothing here.
    const elsewhere = await SandboxTokens.load(join(await dataDir(), 'e2b-token-secret'));
    assert.equal(again.isAccessToken(sbx, elsewhere.accessToken(sbx)), false);
  });
});

describe('cluster nodes', () => {
  test("issue under the cluster's one secret: a token of one node opens the sandbox on another", async () => {
    const store = new MemoryStore();
    const one = await SandboxTokens.ofClusterNode(await dataDir(), nodeOf(store, 'n1'), log);
    const two = await SandboxTokens.ofClusterNode(await dataDir(), nodeOf(store, 'n2'), log);
    assert.equal(two.accessToken(sbx), one.accessToken(sbx));
    assert.equal(two.trafficToken(sbx), one.trafficToken(sbx));
    assert.equal(two.isAccessToken(sbx, one.accessToken(sbx)), true);
    assert.equal(two.isTrafficToken(sbx, one.trafficToken(sbx)), true);
    // One key, made once; its value is no token.
    const stored = store.keys.get(sharedSecretKey(E2B_TOKEN_SECRET));
    assert.ok(stored);
    assert.equal([...store.keys.keys()].filter((k) => k.startsWith('secrets/')).length, 1);
    assert.doesNotMatch(stored.value, new RegExp(one.accessToken(sbx)));
  });

  test("still accept tokens of the node's own secret, on that node only", async () => {
    const store = new MemoryStore();
    const dir = await dataDir();
    // The node ran alone before it joined: its clients hold tokens of its own secret.
    const before = await SandboxTokens.load(join(dir, 'e2b-token-secret'));
    const old = { access: before.accessToken(sbx), traffic: before.trafficToken(sbx) };
    const joined = await SandboxTokens.ofClusterNode(dir, nodeOf(store, 'n1'), log);
    const peer = await SandboxTokens.ofClusterNode(await dataDir(), nodeOf(store, 'n2'), log);
    assert.notEqual(joined.accessToken(sbx), old.access, 'new tokens are the cluster’s');
    assert.equal(joined.isAccessToken(sbx, old.access), true);
    assert.equal(joined.isTrafficToken(sbx, old.traffic), true);
    assert.deepEqual(joined.accessTokens(sbx), [joined.accessToken(sbx), old.access]);
    assert.equal(peer.isAccessToken(sbx, old.access), false);
    assert.equal(peer.isTrafficToken(sbx, old.traffic), false);
  });

  test('a node restarted while etcd is down keeps the cluster’s secret it had, and takes etcd’s when it answers', async () => {
    const store = new MemoryStore();
    const dir = await dataDir();
    const issued = (await SandboxTokens.ofClusterNode(dir, nodeOf(store, 'n1'), log)).accessToken(
      sbx,
    );
    store.down = true;
    const node = nodeOf(store, 'n1');
    try {
      const restarted = await SandboxTokens.ofClusterNode(dir, node, log, 60_000);
      assert.equal(restarted.accessToken(sbx), issued);
      // etcd's copy was replaced meanwhile (a new cluster): the node takes it once etcd answers.
      store.keys.delete(sharedSecretKey(E2B_TOKEN_SECRET));
      store.down = false;
      const fresh = await sharedSecret(store.client(), E2B_TOKEN_SECRET);
      // It issues under the new one as soon as it has it, and keeps a copy a moment later.
      const kept = join(dir, 'e2b-cluster-token-secret');
      await eventually('the node to take etcd’s secret and keep it', async () => {
        const copy = await readFile(kept).catch(() => null);
        return restarted.accessToken(sbx) !== issued && copy !== null && copy.equals(fresh);
      });
    } finally {
      await node.stop();
    }
  });

  test('a first start with etcd down issues under its own secret until etcd answers', async () => {
    const store = new MemoryStore();
    store.down = true;
    const dir = await dataDir();
    const node = nodeOf(store, 'n1');
    try {
      const tokens = await SandboxTokens.ofClusterNode(dir, node, log, 10);
      const own = await SandboxTokens.load(join(dir, 'e2b-token-secret'));
      assert.equal(tokens.accessToken(sbx), own.accessToken(sbx));
      store.down = false;
      const peer = await SandboxTokens.ofClusterNode(await dataDir(), nodeOf(store, 'n2'), log);
      await eventually('the node to take the cluster’s secret', () => {
        return tokens.accessToken(sbx) === peer.accessToken(sbx);
      });
      assert.equal(tokens.isAccessToken(sbx, own.accessToken(sbx)), true);
    } finally {
      await node.stop();
    }
  });

  test('a key that holds no secret is left alone and refused', async () => {
    const store = new MemoryStore();
    const key = sharedSecretKey(E2B_TOKEN_SECRET);
    await store.client().txn([], [{ put: key, value: '{"secret":"c2hvcnQ="}' }]);
    await assert.rejects(sharedSecret(store.client(), E2B_TOKEN_SECRET));
    assert.equal(store.keys.get(key)?.value, '{"secret":"c2hvcnQ="}');
  });
});
