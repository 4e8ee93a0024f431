/**
 * `npm run cluster`: a 3-node hostd cluster on this machine (testkit/cluster.ts) to try cluster
 * mode by hand: etcd, three nodes on 127.0.0.2 to .4 and HAProxy on 127.0.0.1. It prints where
 * everything is and runs until Ctrl-C (or SIGTERM), then stops and removes all of it.
 *
 * Environment: SERVICE_TEMPLATES (default python-slim), SERVICE_API_KEY (default: a random key,
 * printed), CLUSTER_NODES (1 to 3, default 3); other SERVICE_* variables reach every node.
 */
import { startCluster, type Cluster } from './cluster.js';

const say = (line: string): void => void process.stderr.write(`hostd cluster: ${line}\n`);

let cluster: Cluster | null = null;
let stopping: Promise<void> | null = null;
const stop = (why: string): Promise<void> =>
  (stopping ??= (async () => {
    say(`${why}: stopping the nodes, etcd and HAProxy`);
    await cluster?.close();
    say('stopped; nothing is left');
  })());
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => void stop(sig).finally(() => process.exit(0)));
}

async function main(): Promise<void> {
  const passOn: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('SERVICE_') && v !== undefined && !KEPT.has(k)) passOn[k] = v;
  }
  cluster = await startCluster({
    nodes: Number(process.env.CLUSTER_NODES || 3),
    ...(process.env.SERVICE_TEMPLATES ? { templates: process.env.SERVICE_TEMPLATES } : {}),
    ...(process.env.SERVICE_API_KEY ? { apiKey: process.env.SERVICE_API_KEY } : {}),
    env: passOn,
    say,
  });
  if (stopping) return;
  const lines = [
    '',
    `  HAProxy (use this):  ${cluster.url}`,
    ...cluster.nodes.map((n) => `  ${n.id}:              ${n.url}   data ${n.dataDir}`),
    `  etcd:                ${cluster.etcdEndpoints}`,
    `  API key:             ${cluster.apiKey}`,
    '',
    `  try:  curl -s -H 'Authorization: Bearer ${cluster.apiKey}' ${cluster.url}/v1/cluster`,
    '',
    '  Ctrl-C stops and removes everything.',
    '',
  ];
  process.stdout.write(lines.join('\n') + '\n');
}

/** Variables the cluster sets per node itself; a value from the shell would break it. */
const KEPT = new Set([
  'SERVICE_HOSTD_ADDR',
  'SERVICE_NODE_ID',
  'SERVICE_NODE_URL',
  'SERVICE_CLUSTER_ETCD',
  'SERVICE_API_KEYS',
  'SERVICE_API_KEY',
  'SERVICE_STATE_DIR',
  'SERVICE_DATA_DIR',
  'SERVICE_TEMPLATES',
  'SERVICE_HOSTD_URL',
]);

main().catch(async (err: unknown) => {
  say((err as Error).message);
  await stop('start-up failed');
  process.exit(1);
});
