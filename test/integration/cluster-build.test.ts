/**
 * A hand-over between two real nodes whose builds of python-slim differ (docs/cluster.md,
 * Hand-over): node-2 has an image cache of its own and a guest agent with one more line (a
 * comment, through HOSTD_AGENT_DIR), so its boot image, and with it its build of python-slim,
 * is another one (another initramfs, another key); the root filesystem, which takes minutes to
 * build, is shared with the machine's cache by hard links. A sandbox drained from node-1 to
 * node-2 arrives with node-1's build, copied into node-2's cache, and runs on it with its REPL
 * state, while node-2's own build stays (the files both builds share linked from it, not
 * fetched); once the sandbox is deleted the copy goes.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { appendFile, chmod, cp, mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { drainNode, startCluster, type Cluster } from '../../testkit/cluster.js';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import type { Api } from '../../testkit/hostd.js';
import type { SandboxInfo } from '../../testkit/sandboxes.js';

const sh = promisify(execFile);
const CACHE = process.env.SERVICE_CACHE_DIR ?? '/var/cache/hostd';
const ROOT = new URL('../../../', import.meta.url).pathname;

type Info = SandboxInfo & { node: string };
type NodeView = { id: string; templates: Record<string, { state: string; build: string | null }> };

let cluster: Cluster | null = null;
let work: string;
let cacheB: string;
let sandbox: string | null = null;

async function info(api: Api, id: string): Promise<Info> {
  const res = await api.json<Info>('GET', `/v1/sandboxes/${id}`);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

async function imageKey(api: Api): Promise<string | null> {
  const res = await api.json<{ state: string; image_key: string | null }>(
    'GET',
    '/v1/templates/python-slim',
  );
  return res.status === 200 && res.body.state === 'ready' ? res.body.image_key : null;
}

/** The copies of builds in node-2's image cache: `<template>/<key>-<digest>` folders. */
async function copies(): Promise<string[]> {
  const root = join(cacheB, 'copies');
  const found: string[] = [];
  for (const holder of await readdir(root).catch(() => [] as string[])) {
    for (const t of await readdir(join(root, holder, 'python-slim')).catch(() => [] as string[]))
      if (!t.startsWith('.')) found.push(join(root, holder, 'python-slim', t));
  }
  return found;
}

before(async () => {
  work = await mkdtemp('/var/tmp/hostd-build-b-');
  // QEMU's account passes through to node-2's image cache.
  await chmod(work, 0o711);
  cacheB = join(work, 'cache');
  await sh('mkdir', ['-p', cacheB]);
  // Everything of the machine's cache but its templates (and copies): hard links, no bytes.
  for (const name of await readdir(CACHE)) {
    if (name === 'templates' || name === 'copies' || name.endsWith('.lock')) continue;
    await sh('cp', ['-al', join(CACHE, name), join(cacheB, name)]);
  }
  const agent = join(work, 'agent');
  await cp(join(ROOT, 'guest', 'agent'), agent, { recursive: true });
  await appendFile(join(agent, 'agent.py'), '\n# node-2 of the cluster-build test\n');
  cluster = await startCluster({
    nodes: 2,
    nodeEnv: { 'node-2': { SERVICE_CACHE_DIR: cacheB, HOSTD_AGENT_DIR: agent } },
  });
});

after(async () => {
  if (sandbox && cluster) {
    await cluster.api.request('DELETE', `/v1/sandboxes/${sandbox}`).catch(() => undefined);
  }
  await cluster?.close();
  await rm(work, { recursive: true, force: true });
});

describe('a hand-over onto a node whose build of the template differs', () => {
  test('the sandbox arrives on the source’s build, copied, with its REPL state; the copy goes with it', async () => {
    const c = cluster!;
    try {
      await handOver(c);
    } catch (err) {
      console.log(`sandbox ${sandbox}\n${c.logTail(30)}`);
      throw err;
    }
  });
});

async function handOver(c: Cluster): Promise<void> {
  const n1 = c.node('node-1');
  const n2 = c.node('node-2');
  // node-2 builds its own python-slim (its boot image: seconds) and boots it.
  const key2 = await eventually('node-2’s python-slim ready', () => imageKey(n2.api), {
    timeoutMs: 900_000,
    everyMs: 1000,
  });
  const key1 = await eventually('node-1’s python-slim ready', () => imageKey(n1.api));
  assert.notEqual(key1, key2);
  // node-1's drain picks targets from the node records it sees, which node-2 publishes a moment
  // after its template is ready: drained before then, the sandbox has nowhere to go and stays.
  await eventually('node-1 to see node-2’s build of python-slim ready', async () => {
    const res = await n1.api.json<{ nodes: NodeView[] }>('GET', '/v1/cluster');
    const t = res.body.nodes.find((n) => n.id === 'node-2')?.templates['python-slim'];
    return t?.state === 'ready' && t.build === key2;
  });

  const res = await n1.api.json<{ id: string }>('POST', '/v1/sandboxes', {
    template: 'python-slim',
  });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  sandbox = res.body.id;
  assert.equal((await info(n1.api, sandbox)).node, 'node-1');
  assert.equal((await run(n1.api, sandbox, 'x = 41')).exit, 0);

  // A drain that leaves the sandbox on node-1 fails here at once, with the nodes' log tail.
  await drainNode(c, 'node-1', { via: n1.api, timeoutMs: 600_000, everyMs: 500 });
  assert.equal((await info(n2.api, sandbox)).node, 'node-2');
  const [copy] = await copies();
  assert.ok(copy, 'a copy of node-1’s build in node-2’s cache');
  assert.ok(copy.endsWith(`/${key1}-${copy.slice(-16)}`), copy);
  assert.ok(existsSync(join(copy, 'manifest.json')));
  const own = join(cacheB, 'templates', 'python-slim', key2!);
  assert.ok(existsSync(join(own, 'manifest.json')));
  // The files both builds share (all but the initramfs, which holds the agent) were linked
  // from node-2's own build, not fetched; the initramfs came from node-1.
  const ino = async (p: string): Promise<number> => (await stat(p)).ino;
  assert.equal(await ino(join(copy, 'rootfs.erofs')), await ino(join(own, 'rootfs.erofs')));
  assert.notEqual(await ino(join(copy, 'initrd.cpio')), await ino(join(own, 'initrd.cpio')));

  const out = await run(n2.api, sandbox, 'print(x + 1)');
  assert.equal(out.stdout, '42\n', out.stderr);
  const del = await n2.api.request('DELETE', `/v1/sandboxes/${sandbox}`);
  assert.ok(del.status === 200 || del.status === 204, await del.text());
  sandbox = null;
  await eventually('the copy collected', async () => (await copies()).length === 0, {
    timeoutMs: 60_000,
    everyMs: 200,
  });
  assert.ok(existsSync(join(cacheB, 'templates', 'python-slim', key2!, 'manifest.json')));
}
