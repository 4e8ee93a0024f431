/**
 * A hostd cluster on this machine's loopback, for `npm run cluster`, the cluster tests and the
 * bench: a 3-member etcd cluster (Debian's etcd-server), hostd nodes each with its own state and
 * data directories on 127.0.0.2, .3, .4 and HAProxy (Debian's) in front on 127.0.0.1, as
 * docs/operations.md describes for real hosts. Nothing listens beyond 127.0.0.0/8.
 *
 * Everything it starts is stopped and removed by `close()`, also when starting fails half-way:
 * the nodes (and any QEMU of their state directories: a SIGKILLed node leaves its VMs running),
 * the etcd members and their data, HAProxy and its configuration. Tests start one cluster per
 * file and share it across that file's tests; faults (a node killed, an etcd member stopped) are
 * made and undone through the handles here, and waited on through the API, never by sleeping.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, connect as tcpConnect } from 'node:net';
import { join } from 'node:path';
import type { ClusterNode as NodeView, DrainReport } from '../src/api/wire/cluster.js';
import { findProcessesUsing } from '../src/state-dir.js';
import { eventually } from './eventually.js';
import { connect, startHostd, type Api, type Hostd } from './hostd.js';

export interface ClusterOptions {
  /** hostd nodes (at most 3: 127.0.0.2 to .4). Default 3. */
  nodes?: number;
  /** SERVICE_TEMPLATES of every node. Default python-slim (small and quick under TCG). */
  templates?: string;
  /** More environment for every node (SERVICE_POOL_SIZE is 1 unless given). */
  env?: Record<string, string>;
  /** More environment for one node, by id (`node-2`): its own image cache, say. */
  nodeEnv?: Record<string, Record<string, string>>;
  /** The API key clients send (SERVICE_API_KEYS of every node). Default: a random one. */
  apiKey?: string;
  /** Lease TTL of the nodes (SERVICE_CLUSTER_TTL_S). Default: hostd's. */
  ttlS?: number;
  /** Where progress lines go (the CLI prints them). */
  say?: (line: string) => void;
}

/** One etcd member: stopped and started again by tests (one member down, etcd down). */
export interface EtcdMember {
  readonly name: string;
  readonly clientUrl: string;
  readonly running: boolean;
  stop(): Promise<void>;
  start(): Promise<void>;
}

/** One hostd node of the cluster, with a stable id, address and directories across restarts. */
export interface ClusterNode {
  readonly id: string;
  /** Where peers and HAProxy reach it (SERVICE_NODE_URL). */
  readonly url: string;
  /** Its E2B-compatible front's origin (SERVICE_E2B_ADDR), what E2B's SDKs are pointed at. */
  readonly e2bUrl: string;
  /** A client of this node alone (no HAProxy). */
  readonly api: Api;
  readonly stateDir: string;
  readonly dataDir: string;
  /** The running hostd, or null while the node is down. */
  readonly hostd: Hostd | null;
  /** Starts it again on its own directories (after stop or kill). */
  start(): Promise<void>;
  /** Signals hostd and waits for it to exit: SIGTERM drains it, SIGINT pauses in place. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  /** SIGKILL: hostd dies at once, its VMs run on (as after a crash). */
  kill(): Promise<void>;
  /** hostd's log lines of every run of this node. */
  readonly logs: string[];
}

export interface Cluster {
  /** HAProxy's URL: what clients use. */
  readonly url: string;
  /** A client through HAProxy. */
  readonly api: Api;
  readonly apiKey: string;
  readonly nodes: readonly ClusterNode[];
  readonly etcd: readonly EtcdMember[];
  /** SERVICE_CLUSTER_ETCD of the nodes. */
  readonly etcdEndpoints: string;
  /** The node with this id. */
  node(id: string): ClusterNode;
  /** The last lines of every node's log, for failure reports. */
  logTail(lines?: number): string;
  close(): Promise<void>;
}

/** A free TCP port on `host` (taken by the caller soon after: a race no test has lost). */
export async function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, host, () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Resolves once something accepts TCP connections on host:port. */
async function listening(what: string, host: string, port: number, timeoutMs = 30_000) {
  await eventually(
    what,
    () =>
      new Promise<boolean>((resolve) => {
        const socket = tcpConnect({ host, port });
        socket.once('connect', () => {
          socket.destroy();
          resolve(true);
        });
        socket.once('error', () => resolve(false));
      }),
    { timeoutMs, everyMs: 50 },
  );
}

/** A child process whose output is kept (for failure reports) and whose exit is awaited. */
interface Child {
  proc: ChildProcess;
  exited: Promise<void>;
  done: boolean;
}

/**
 * Starts an etcd cluster of `count` members on 127.0.0.2 and up (data under `work`), and resolves
 * once it has a leader. Each member can be stopped and started again on its data.
 */
export async function startEtcd(
  work: string,
  count: number,
  logs: string[] = [],
): Promise<EtcdMember[]> {
  const members: (EtcdMember & { child: Child | null })[] = [];
  try {
    // Members on the nodes' addresses, each with its own client and peer port.
    const ports = await Promise.all(
      NODE_HOSTS.slice(0, count).map(async (host) => ({
        host,
        client: await freePort(host),
        peer: await freePort(host),
      })),
    );
    const initial = ports.map((p, i) => `e${i + 1}=http://${p.host}:${p.peer}`).join(',');
    const token = `hostd-${randomBytes(4).toString('hex')}`;
    ports.forEach((p, i) => {
      const name = `e${i + 1}`;
      const clientUrl = `http://${p.host}:${p.client}`;
      const args = [
        `--name=${name}`,
        `--data-dir=${join(work, `etcd-${name}`)}`,
        `--listen-client-urls=${clientUrl}`,
        `--advertise-client-urls=${clientUrl}`,
        `--listen-peer-urls=http://${p.host}:${p.peer}`,
        `--initial-advertise-peer-urls=http://${p.host}:${p.peer}`,
        `--initial-cluster=${initial}`,
        `--initial-cluster-state=new`,
        `--initial-cluster-token=${token}`,
        // A loaded 2-core host stalls processes for hundreds of ms: etcd's defaults (100 ms
        // heartbeats, 1 s elections) would change leaders all the time.
        '--heartbeat-interval=250',
        '--election-timeout=2500',
        '--logger=zap',
        '--log-outputs=stderr',
      ];
      const member = {
        name,
        clientUrl,
        child: null as Child | null,
        get running() {
          return member.child !== null && !member.child.done;
        },
        async start() {
          if (member.running) return;
          member.child = spawnKept('etcd', args, logs);
          await listening(`etcd ${name}`, p.host, p.client);
        },
        async stop() {
          await stopChild(member.child);
        },
      };
      members.push(member);
    });
    await Promise.all(members.map((m) => m.start()));
    await eventually(
      'the etcd cluster to elect a leader',
      async () => {
        const res = await fetch(`${members[0]!.clientUrl}/health`).catch(() => null);
        return res?.ok && ((await res.json()) as { health?: string }).health === 'true';
      },
      { timeoutMs: 60_000, everyMs: 100 },
    );
    return members;
  } catch (err) {
    await Promise.all(members.map((m) => m.stop()));
    throw err;
  }
}

function spawnKept(file: string, args: string[], logs: string[]): Child {
  const proc = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  for (const stream of [proc.stdout!, proc.stderr!]) {
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => logs.push(...chunk.split('\n').filter(Boolean)));
  }
  const child: Child = { proc, done: false, exited: Promise.resolve() };
  child.exited = new Promise((resolve) =>
    proc.once('exit', () => {
      child.done = true;
      resolve();
    }),
  );
  return child;
}

async function stopChild(child: Child | null, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (!child || child.done) return;
  child.proc.kill(signal);
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), 15_000);
  await child.exited;
  clearTimeout(timer);
}

const NODE_HOSTS = ['127.0.0.2', '127.0.0.3', '127.0.0.4'];

/**
 * Starts etcd, the nodes and HAProxy, and resolves once HAProxy serves and every node has joined
 * the cluster (`GET /v1/cluster` lists them all serving). On failure everything started is
 * stopped and removed before the error is thrown.
 */
export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  const say = opts.say ?? (() => undefined);
  const count = opts.nodes ?? 3;
  if (count < 1 || count > NODE_HOSTS.length) throw new Error(`1 to 3 nodes, not ${count}`);
  const work = await mkdtemp('/var/tmp/hostd-cluster-');
  // QEMU runs as its own account (as root: hostd-vm): it must pass through to the data dirs.
  await chmod(work, 0o711);
  const apiKey = opts.apiKey ?? `cluster-${randomBytes(8).toString('hex')}`;
  const etcdLogs: string[] = [];
  const members: EtcdMember[] = [];
  const nodes: (ClusterNode & { host: Hostd | null })[] = [];
  let haproxy: Child | null = null;
  const haproxyLogs: string[] = [];
  let closed = false;

  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    await stopChild(haproxy);
    // SIGINT: no drain (there is nowhere to hand sandboxes to); each pauses in place and stops.
    await Promise.all(nodes.map((n) => n.stop('SIGINT').catch(() => undefined)));
    for (const n of nodes) {
      for (const pid of await findProcessesUsing(n.stateDir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone meanwhile
        }
      }
    }
    await Promise.all(members.map((m) => m.stop()));
    for (const n of nodes) await rm(n.stateDir, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
  };

  try {
    say('starting etcd');
    members.push(...(await startEtcd(work, NODE_HOSTS.length, etcdLogs)));
    say(`etcd serving at ${members.map((m) => m.clientUrl).join(', ')}`);
    const etcdEndpoints = members.map((m) => m.clientUrl).join(',');

    // hostd nodes: fixed addresses and directories, so that a restart is the same node.
    for (let i = 0; i < count; i++) {
      const host = NODE_HOSTS[i]!;
      const port = await freePort(host);
      const e2bPort = await freePort(host);
      const id = `node-${i + 1}`;
      const url = `http://${host}:${port}`;
      const stateDir = `/dev/shm/hostd-test-cluster-${randomBytes(4).toString('hex')}-${id}`;
      const dataDir = join(work, `data-${id}`);
      // Each run's log lines (startHostd's list, which grows while hostd runs).
      const runs: string[][] = [];
      const env: Record<string, string> = {
        SERVICE_HOSTD_ADDR: `${host}:${port}`,
        SERVICE_E2B_ADDR: `${host}:${e2bPort}`,
        SERVICE_NODE_ID: id,
        SERVICE_NODE_URL: url,
        SERVICE_CLUSTER_ETCD: etcdEndpoints,
        SERVICE_API_KEYS: apiKey,
        SERVICE_TEMPLATES: opts.templates ?? 'python-slim',
        SERVICE_POOL_SIZE: '1',
        SERVICE_FORK_STANDBY_MAX: '0',
        ...(opts.ttlS ? { SERVICE_CLUSTER_TTL_S: String(opts.ttlS) } : {}),
        ...opts.env,
        ...opts.nodeEnv?.[id],
      };
      const node = {
        id,
        url,
        e2bUrl: `http://${host}:${e2bPort}`,
        api: connect(url, apiKey),
        stateDir,
        dataDir,
        get logs() {
          return runs.flat();
        },
        host: null as Hostd | null,
        get hostd() {
          return node.host;
        },
        async start() {
          if (node.host && node.host.proc.exitCode === null && !node.host.proc.killed) return;
          const started = await startHostd({
            env,
            apiKey,
            stateDir,
            dataDir,
            startTimeoutMs: 900_000,
          });
          runs.push(started.logs);
          node.host = started;
        },
        async stop(signal: NodeJS.Signals = 'SIGTERM') {
          const h = node.host;
          if (!h) return null;
          node.host = null;
          return h.stop(signal);
        },
        async kill() {
          const h = node.host;
          if (!h) return;
          node.host = null;
          await h.stop('SIGKILL');
        },
      };
      nodes.push(node);
    }
    say(`starting ${count} hostd nodes (each boots ${opts.templates ?? 'python-slim'} first)`);
    await Promise.all(nodes.map((n) => n.start()));

    // HAProxy in front: the documented production setup (docs/operations.md).
    const proxyPort = await freePort('127.0.0.1');
    const config = haproxyConfig(
      `127.0.0.1:${proxyPort}`,
      nodes.map((n) => ({ id: n.id, address: new URL(n.url).host })),
    );
    const configPath = join(work, 'haproxy.cfg');
    await writeFile(configPath, config);
    haproxy = spawnKept('haproxy', ['-db', '-f', configPath], haproxyLogs);
    await listening('HAProxy', '127.0.0.1', proxyPort);
    const url = `http://127.0.0.1:${proxyPort}`;
    const api = connect(url, apiKey);
    await eventually(
      'every node to join the cluster',
      async () => {
        const res = await api.json<{ nodes?: { id: string; state: string }[] }>(
          'GET',
          '/v1/cluster',
        );
        const serving = (res.body?.nodes ?? []).filter((n) => n.state === 'serving').length;
        return res.status === 200 && serving === count;
      },
      { timeoutMs: 120_000, everyMs: 100 },
    );
    say(`cluster serving through HAProxy at ${url}`);
    return {
      url,
      api,
      apiKey,
      nodes,
      etcd: members,
      etcdEndpoints,
      node(id) {
        const n = nodes.find((x) => x.id === id);
        if (!n) throw new Error(`no node ${id} (nodes: ${nodes.map((x) => x.id).join(', ')})`);
        return n;
      },
      logTail(lines = 15) {
        const parts = nodes.map((n) => `--- ${n.id}\n${n.logs.slice(-lines).join('\n')}`);
        parts.push(`--- etcd\n${etcdLogs.slice(-5).join('\n')}`);
        parts.push(`--- haproxy\n${haproxyLogs.slice(-5).join('\n')}`);
        return parts.join('\n');
      },
      close,
    };
  } catch (err) {
    const tail = [
      ...nodes.map((n) => `--- ${n.id}\n${n.logs.slice(-20).join('\n')}`),
      `--- etcd\n${etcdLogs.slice(-10).join('\n')}`,
      `--- haproxy\n${haproxyLogs.slice(-10).join('\n')}`,
    ].join('\n');
    await close();
    throw new Error(`the cluster did not start: ${(err as Error).message}\n${tail}`);
  }
}

/**
 * HAProxy's configuration for `nodes`: round robin over the nodes that answer /v1/healthz, and a
 * request whose node refused the connection (stopped, restarting) is sent to another. Timeouts
 * are long: an exec streams for as long as its code runs, a file transfer for its size.
 */
export function haproxyConfig(bind: string, nodes: { id: string; address: string }[]): string {
  return [
    'global',
    '  maxconn 4096',
    'defaults',
    '  mode http',
    '  timeout connect 2s',
    '  timeout client 1h',
    '  timeout server 1h',
    '  timeout http-request 60s',
    '  retries 3',
    '  option redispatch',
    'frontend hostd',
    `  bind ${bind}`,
    '  default_backend nodes',
    'backend nodes',
    '  balance roundrobin',
    '  option httpchk',
    '  http-check send meth GET uri /v1/healthz',
    ...nodes.map((n) => `  server ${n.id} ${n.address} check inter 1s fall 2 rise 1`),
    '',
  ].join('\n');
}

/** A node as `GET /v1/cluster` lists it, and its drain report (docs/api.md, Cluster). */
export type { NodeView, DrainReport };

/** Node `id` as `api`'s `GET /v1/cluster` shows it; undefined when it is not listed. */
export async function nodeView(api: Api, id: string): Promise<NodeView | undefined> {
  const res = await api.json<{ nodes?: NodeView[] }>('GET', '/v1/cluster');
  if (res.status !== 200) throw new Error(`GET /v1/cluster: ${res.status}`);
  return res.body.nodes?.find((n) => n.id === id);
}

export interface DrainWait {
  /** The node asked (default: through HAProxy). */
  via?: Api;
  /**
   * The `drain.started_at` of the round to wait for (the drain route's 202 body has it): an
   * earlier round's report, still shown by a node whose view lags, is not taken for its end.
   */
  since?: string;
  timeoutMs?: number;
  everyMs?: number;
}

/**
 * Resolves with node `id` as listed once its drain ended, whatever it left (`drain.left` and
 * `drain.snapshots_left` say what; the node is `drained` when nothing). Fails at once when the
 * node is down or gone meanwhile (a drain does not end then), and with the nodes' log tail on
 * a timeout. For a test that expects a drain to leave something; `waitDrained` for one that
 * expects it to empty the node.
 */
export async function waitDrainEnded(
  cluster: Cluster,
  id: string,
  opts: DrainWait = {},
): Promise<NodeView> {
  const { via = cluster.api, since, timeoutMs = 300_000, everyMs = 200 } = opts;
  try {
    return await eventually(
      `the drain of ${id} to end`,
      async () => {
        const n = await nodeView(via, id);
        if (!n || n.state === 'down') {
          throw new Error(`${id} is ${n ? 'down' : 'no longer listed'}: its drain will not end`);
        }
        const report = n.drain;
        // A node older than drain reports shows none: its end is `drained` only.
        if (!report) return n.state === 'drained' && since === undefined ? n : null;
        if (since !== undefined && report.started_at < since) return null;
        return report.ended_at !== null ? n : null;
      },
      { timeoutMs, everyMs },
    );
  } catch (err) {
    throw new Error(`${(err as Error).message}\nthe nodes' log tail:\n${cluster.logTail(60)}`);
  }
}

/** A drain that ended with sandboxes or snapshots left on its node: it will not be `drained`. */
export class DrainLeftError extends Error {
  constructor(
    readonly node: string,
    readonly report: DrainReport,
    logTail: string,
  ) {
    super(
      `the drain of ${node} ended with ${report.left} sandbox(es) and ${report.snapshots_left} ` +
        `snapshot(s) left (moved ${report.moved} and ${report.snapshots_moved}); the node stays ` +
        `draining; left: ${[...(report.left_sandboxes ?? []), ...(report.left_snapshots ?? [])].join(', ') || '?'}` +
        `\nthe nodes' log tail:\n${logTail}`,
    );
  }
}

/**
 * Waits until node `id` is `drained`; a drain that ends with something left fails at once
 * (DrainLeftError, with the nodes' log tail) instead of waiting out the timeout.
 */
export async function waitDrained(
  cluster: Cluster,
  id: string,
  opts: DrainWait = {},
): Promise<NodeView> {
  const n = await waitDrainEnded(cluster, id, opts);
  if (n.state !== 'drained' && n.drain) throw new DrainLeftError(id, n.drain, cluster.logTail(60));
  return n;
}

/**
 * `POST /v1/cluster/nodes/{id}/drain` through `via` (default HAProxy), then `waitDrained` for
 * that round. Returns the node once `drained`.
 */
export async function drainNode(
  cluster: Cluster,
  id: string,
  opts: Omit<DrainWait, 'since'> = {},
): Promise<NodeView> {
  const via = opts.via ?? cluster.api;
  const res = await via.json<NodeView>('POST', `/v1/cluster/nodes/${id}/drain`);
  if (res.status !== 202) {
    throw new Error(`drain of ${id}: ${res.status} ${JSON.stringify(res.body)}`);
  }
  return waitDrained(cluster, id, { ...opts, via, since: res.body.drain?.started_at });
}

/**
 * `POST /v1/cluster/nodes/{id}/undrain` through `via` (default HAProxy), then waits until `via`
 * lists the node `serving` (another node's copy of its record lags up to 2 s). Returns the node
 * as listed then. A drain running there starts no further move; `waitDrainEnded` waits for the
 * hand-overs under way.
 */
export async function undrainNode(
  cluster: Cluster,
  id: string,
  opts: { via?: Api; timeoutMs?: number } = {},
): Promise<NodeView> {
  const { via = cluster.api, timeoutMs = 30_000 } = opts;
  const res = await via.json<NodeView>('POST', `/v1/cluster/nodes/${id}/undrain`);
  if (res.status !== 200) {
    throw new Error(`undrain of ${id}: ${res.status} ${JSON.stringify(res.body)}`);
  }
  return eventually(
    `${id} to be listed serving`,
    async () => {
      const n = await nodeView(via, id);
      return n?.state === 'serving' ? n : null;
    },
    { timeoutMs, everyMs: 200 },
  );
}
