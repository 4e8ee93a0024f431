/**
 * hostd's entry point: read configuration, claim the state directory, boot the templates,
 * serve HTTP, and on SIGTERM/SIGINT destroy every VM and leave nothing behind.
 */
import type { FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import { ConfigError, isLoopback, loadConfig, type Config } from './config.js';
import { exitOnUncaught } from './fail-fast.js';
import { authMode, type AuthMode } from './api/auth.js';
import { createMetrics, type Metrics } from './api/metrics.js';
import { buildServer } from './api/server.js';
import { SandboxTokens } from './api/e2b/auth.js';
import { peerE2bUrl } from './api/e2b/cluster-hop.js';
import { buildE2bServer } from './api/e2b/server.js';
import { sandboxSizing, type SandboxSizing } from './core/admission.js';
import { CLUSTER_KEY_HEADER } from './core/cluster/headers.js';
import { cachedHostFree, hostFree, hostMemTotalMib } from './core/host-resources.js';
import { FileRecords, type SandboxRecord } from './core/journal.js';
import { SandboxManager } from './core/sandbox-manager.js';
import { chooseAccel, hostTscKhz, type AccelDecision } from './vm/qemu/accel.js';
import { QemuHypervisor } from './vm/qemu/hypervisor.js';
import { guestImageOf } from './vm/image/image.js';
import { CachedTemplateImages } from './vm/image/template-images.js';
import { BUILTIN_RECIPE_DIR, loadRecipes, RecipeError } from './core/recipe.js';
import { planTemplates, UnknownRecipeError, type TemplatePlan } from './core/template-plan.js';
import { capstoneStandIn } from './vm/host/capstone-stand-in.js';
import { ramOpenShim } from './vm/host/ram-open-shim.js';
import { memoryFlagsLauncher } from './vm/host/memory-flags.js';
import { enableKsm } from './vm/host/ksm.js';
import {
  claimDataDir,
  claimStateDir,
  DirectoryInUseError,
  ensureDirsFree,
  releaseDataDir,
  releaseStateDir,
} from './state-dir.js';
import { canRead, lookupUser, type VmUser } from './vm/host/vm-user.js';
import { Jail, jailView, type JailOptions, type VmJail } from './vm/host/vm-jail.js';
import { detectCgroups } from './vm/host/vm-cgroups.js';
import { VmUidPool, accountsInRange } from './vm/host/vm-uids.js';
import { readFileSync } from 'node:fs';
import { HttpPeers } from './cluster/peer-http.js';
import { Drainer } from './core/cluster/drain.js';
import { HandOver } from './core/cluster/hand-over.js';
import { SnapshotCopies } from './core/cluster/snapshot-copies.js';
import { ClusterNode, type LocalSandboxes } from './core/cluster/cluster-node.js';
import type { RecordStore, SnapshotRecord } from './core/journal.js';
import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import { dirname, join } from 'node:path';

const HOSTD_VERSION = '0.1.0';

/** hostd's start, step by step; each step is a function below, in this order. */
async function main(): Promise<void> {
  const { config, auth } = readSettings();
  const log = createLogger(config);
  announceAuth(log, auth, config);
  const { vmUser, makeJail } = await jailVms(config, log);
  // A bug leaves hostd in an unknown state: it logs and exits (src/fail-fast.ts); its VMs run
  // on, and the next start re-adopts them.
  exitOnUncaught(log);
  await claimDirs(config, vmUser);
  for (const v of config.retired) log.warn(`${v.name} is not read any more: ${v.why}`);
  const accel = chooseAccel(config.accel);
  log.info({ accel: accel.accel, reason: accel.reason }, 'accelerator chosen');
  const templates = await planTemplatesOrExit(config);
  const images = templateImages(config, vmUser, log);
  images.lookAhead(templates.flatMap((t) => (t.recipe instanceof RecipeError ? [] : [t.recipe])));
  const sizing = sandboxSizing({
    configuredMax: config.maxSandboxes,
    memTotalMib: hostMemTotalMib(),
    tcgTbMib: accel.accel === 'tcg' ? config.tcgTbMib : null,
  });
  log.info(sizing, 'sandbox cap');
  const hypervisor = await startHypervisor(config, accel.accel, makeJail, sizing.perVmMib, log);
  const ports = new ApiPorts(config.port);
  const metrics = createMetrics({ accel: accel.accel, version: HOSTD_VERSION });
  // Cluster mode (SERVICE_CLUSTER_ETCD): this node's records are mirrored into etcd's catalog.
  const cluster = config.cluster ? await clusterNode(config, log) : null;
  const { manager, sandboxRecords } = createManager(
    config,
    { templates, images, sizing, ports, cluster, accel: accel.accel },
    hypervisor,
    log,
    metrics,
  );
  metrics.bind(manager);
  cluster?.bind(clusterView(config, manager, sizing));
  const moves = cluster ? movesOf(config, cluster, manager, log) : null;
  const servers = await buildServers(config, { manager, auth, log, metrics, cluster, moves });
  const stop = stopOnSignals(config, { manager, sandboxRecords, cluster, moves, servers, log });
  await bootTemplates(manager, stop, log);
  const { address, e2bAddress } = await listen(config, servers, ports, stop, log);
  if (cluster) {
    // Joins once it serves: peers may forward to it as soon as its record appears.
    cluster.url = config.cluster?.nodeUrl ?? address;
    if (e2bAddress) cluster.e2bUrl = peerE2bUrl(e2bAddress, cluster.url);
    await cluster.start();
  }
  // Where a client that started hostd on port 0 (tests, scripts) finds it, without parsing logs.
  await writeFile(join(config.stateDir, 'hostd.url'), `${address}\n`, { mode: 0o600 });
  log.info(
    { address, accel: accel.accel, templateBootMs: manager.templateBootMs() },
    `hostd listening on ${address}`,
  );
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError || err instanceof DirectoryInUseError) {
    process.stderr.write(`hostd: ${err.message}\n`);
  } else process.stderr.write(`hostd: fatal: ${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});

/** A start refused before anything is touched: said on stderr, exit status 2. */
function refuse(message: string): never {
  process.stderr.write(`hostd: ${message}\n`);
  process.exit(2);
}

/** The configuration and the authentication it implies, or exit 2 saying what is wrong. */
function readSettings(): { config: Config; auth: AuthMode } {
  try {
    const config = loadConfig();
    const auth = authMode({
      apiKeys: config.apiKeys,
      authDisabled: config.authDisabled,
      // The E2B front runs code for whoever reaches it too: both binds must be loopback.
      loopback: isLoopback(config.host) && (!config.e2bAddr || isLoopback(config.e2bAddr.host)),
    });
    return { config, auth };
  } catch (err) {
    return refuse((err as Error).message);
  }
}

/** hostd's log: JSON lines on stdout, with credentials redacted wherever they appear. */
function createLogger(config: Config): Logger {
  return pino({
    level: config.logLevel,
    base: { service: 'hostd' },
    redact: {
      paths: [
        'req.headers.authorization',
        'req.headers["x-api-key"]',
        'req.headers["x-access-token"]',
        `req.headers["${CLUSTER_KEY_HEADER}"]`,
        'apiKeys',
      ],
      censor: '[redacted]',
    },
  });
}

/** Says how clients are authenticated; loudly when nobody is. */
function announceAuth(log: Logger, auth: AuthMode, config: Config): void {
  if (auth.kind === 'open' && auth.why === 'disabled') {
    log.warn(
      '!!! AUTHENTICATION IS DISABLED (SERVICE_AUTH_DISABLED=1): anyone who can reach ' +
        `${config.host}:${config.port} can run arbitrary code on this host's VMs !!!`,
    );
  } else if (auth.kind === 'open') {
    log.info('no SERVICE_API_KEYS and a loopback bind: authentication is off');
  } else {
    log.info({ keys: auth.keys.length }, 'API key authentication on');
  }
}

/** Makes the jail once its mount view is known (QEMU's libraries and hostd's directories). */
type JailMaker = (view: JailOptions['view']) => VmJail;

/**
 * As root, each QEMU runs jailed as a uid of its own (docs/operations.md, The jail); as anyone
 * else, as that same user, unjailed. Refuses a start whose VM account or uid range is unusable.
 */
async function jailVms(
  config: Config,
  log: Logger,
): Promise<{ vmUser: VmUser | undefined; makeJail: JailMaker | undefined }> {
  if (process.getuid?.() !== 0) {
    log.warn(
      'hostd does not run as root: QEMUs run as its own user, unjailed (docs/operations.md, Security)',
    );
    return { vmUser: undefined, makeJail: undefined };
  }
  const vmUser = lookupUser(config.vmUser);
  if (!vmUser) {
    refuse(
      `running as root but the account "${config.vmUser}" (SERVICE_VM_USER) that QEMU should run as does not exist; create it with:\n  useradd --system --no-create-home --shell /usr/sbin/nologin ${config.vmUser}`,
    );
  }
  const range = config.vmUidRange;
  const clash = accountsInRange(readFileSync('/etc/passwd', 'utf8'), range);
  if (clash.length) {
    refuse(
      `SERVICE_VM_UID_RANGE ${range.first}-${range.last} holds the accounts ${clash.join(', ')}; VMs need uids nobody else uses`,
    );
  }
  const full = config.vmJail === 'full';
  const cg = full ? await detectCgroups() : { cgroups: null, why: 'SERVICE_VM_JAIL=uid' };
  if (full && !cg.cgroups) {
    log.warn(
      { why: cg.why },
      'QEMUs run without a cgroup leaf each: a sandbox can take more than its share of host memory and CPU',
    );
  }
  const uids = new VmUidPool(range);
  const gid = vmUser.gid;
  const makeJail: JailMaker = (view) =>
    new Jail(uids, gid, { namespaces: full, cgroups: cg.cgroups, view });
  log.info(
    {
      group: vmUser.name,
      uids: `${range.first}-${range.last}`,
      namespaces: full,
      cgroups: cg.cgroups?.version ?? null,
    },
    'each QEMU runs jailed as a uid of its own',
  );
  return { vmUser, makeJail };
}

/** Claims the state and data directories; both are checked before either is touched, so a refused start leaves a running hostd as it was. */
async function claimDirs(config: Config, vmUser: VmUser | undefined): Promise<void> {
  await ensureDirsFree(config.stateDir, config.dataDir);
  await claimStateDir(config.stateDir, vmUser?.gid);
  await claimDataDir(config.dataDir, vmUser?.gid);
}

/** The templates to serve from the recipes (built-in and SERVICE_TEMPLATE_DIR's), or exit 2. */
async function planTemplatesOrExit(config: Config): Promise<TemplatePlan[]> {
  const recipes = await loadRecipes([
    BUILTIN_RECIPE_DIR,
    ...(config.templateDir ? [config.templateDir] : []),
  ]);
  try {
    return planTemplates(recipes, config.templates, config.templateDefaults);
  } catch (err) {
    if (!(err instanceof UnknownRecipeError)) throw err;
    return refuse(err.message);
  }
}

/** The template images of the cache, built when missing, each checked readable by QEMU's account. */
function templateImages(
  config: Config,
  vmUser: VmUser | undefined,
  log: Logger,
): CachedTemplateImages {
  return new CachedTemplateImages({
    cacheDir: config.cacheDir,
    onStep: (template, step) => log.info({ template, step }, 'template build step'),
    check: (image) => {
      log.info({ template: image.manifest.name, dir: image.dir, key: image.key }, 'template image');
      if (vmUser && !canRead(vmUser, [image.kernel, image.initrd, image.rootfs])) {
        throw new Error(
          `QEMU's account ${vmUser.name} cannot read the image; build it under a cache directory that account can read (SERVICE_CACHE_DIR; root's default is one)`,
        );
      }
    },
  });
}

/**
 * The host tuned for many VMs (KSM, QEMU's stand-in for libcapstone), then the hypervisor that
 * starts every VM with this host's accelerator and settings.
 */
async function startHypervisor(
  config: Config,
  accel: AccelDecision['accel'],
  makeJail: JailMaker | undefined,
  perVmMib: number,
  log: Logger,
): Promise<QemuHypervisor> {
  const ksm = enableKsm(config.ksm && process.getuid?.() === 0);
  log.info(
    { ...ksm, scope: config.ksmScope },
    'kernel same-page merging (SERVICE_KSM, SERVICE_KSM_SCOPE)',
  );
  const standIn = config.qemuCapstone
    ? { dir: null, why: 'SERVICE_QEMU_CAPSTONE=1' }
    : capstoneStandIn(config.cacheDir, config.qemuBinary);
  log.info(standIn, "QEMU's stand-in for libcapstone (SERVICE_QEMU_CAPSTONE)");
  let jail: VmJail | undefined;
  // Jailed QEMUs map RAM images they cannot write (vm/host/ram-open-shim.ts): without the shim
  // QEMU 7.2 could not open them, so a jail without it does not start.
  const shim = makeJail ? ramOpenShim(config.cacheDir, config.qemuBinary) : null;
  if (shim && shim.path === null) return refuse(`cannot build QEMU's RAM image shim: ${shim.why}`);
  const libs = [
    ...(standIn.dir !== null ? [standIn.dir] : []),
    ...(shim?.path ? [dirname(shim.path)] : []),
  ];
  if (makeJail) {
    const view = jailView({
      vmsDir: join(config.stateDir, 'vms'),
      dataDir: config.dataDir,
      cacheDir: config.cacheDir,
      keep: libs,
      qemuBinary: config.qemuBinary,
      needed: [
        config.stateDir,
        config.dataDir,
        config.cacheDir,
        ...(config.templateDir ? [config.templateDir] : []),
        ...libs,
      ],
    });
    log.info(
      { hidden: view.hide, narrowed: [view.vmsDir, view.dataDir, ...view.narrowed] },
      "each jailed QEMU's mount namespace hides these folders, and narrows these to its own files",
    );
    jail = makeJail(view);
  }
  const tscKhz = hostTscKhz();
  const hypervisor = new QemuHypervisor(
    {
      qemuBinary: config.qemuBinary,
      vmsDir: join(config.stateDir, 'vms'),
      launcher: memoryFlagsLauncher({
        noHugePages: accel === 'tcg' && !config.tcgHugePages,
        mergeAll: config.ksm && config.ksmScope === 'qemu',
      }),
      ...(jail ? { jail } : {}),
      env: {
        ...(standIn.dir !== null ? { LD_LIBRARY_PATH: standIn.dir } : {}),
        ...(shim?.path ? { LD_PRELOAD: shim.path } : {}),
      },
    },
    config.dataDir,
    (_template, shape, image) => ({
      image: {
        ...guestImageOf(image),
        ...(config.tcgCpu === null ? {} : { tcgCpu: config.tcgCpu }),
      },
      memoryMib: shape.memoryMib,
      vcpus: shape.vcpus,
      accel,
      tcgTbMib: config.tcgTbMib,
      tscKhz,
    }),
    perVmMib,
    config.cacheDir,
  );
  await hypervisor.init();
  return hypervisor;
}

/**
 * The ports hostd's APIs listen on, which sandboxes may not reach (core's egress rules); known
 * once they listen (SERVICE_HOSTD_ADDR may ask for port 0).
 */
class ApiPorts {
  e2bPort: number | null = null;
  readonly hostAddresses = hostAddresses();
  constructor(public apiPort: number) {}
  get otherApiPorts(): number[] {
    return this.e2bPort === null ? [] : [this.e2bPort];
  }
}

/** The sandbox manager over this host's records (mirrored into etcd in cluster mode). */
function createManager(
  config: Config,
  parts: {
    templates: TemplatePlan[];
    images: CachedTemplateImages;
    sizing: SandboxSizing;
    ports: ApiPorts;
    cluster: ClusterNode | null;
    accel: AccelDecision['accel'];
  },
  hypervisor: QemuHypervisor,
  log: Logger,
  metrics: Metrics,
): { manager: SandboxManager; sandboxRecords: FileRecords<SandboxRecord> } {
  const { cluster } = parts;
  const sandboxRecords = new FileRecords<SandboxRecord>(join(config.dataDir, 'sandboxes'), {
    // A running sandbox's VM does not outlive the host: only paused and lost ones must.
    lastsReboot: (r) => r.state !== 'running',
    // A create answers once its record is written: its file is opened ahead, off the request.
    openAhead: true,
  });
  const snapshotRecords: RecordStore<SnapshotRecord> = new FileRecords(
    join(config.dataDir, 'snapshots'),
  );
  const manager = new SandboxManager(
    {
      templates: parts.templates,
      images: parts.images,
      maxSandboxes: parts.sizing.maxSandboxes,
      maxQueuedExecs: config.maxQueuedExecs,
      idleTimeoutS: config.idleTimeoutS,
      minFreeMib: config.minFreeMib,
      maxExecOutputBytes: config.maxExecOutputBytes,
      forkStandbyMax: config.forkStandbyMax,
      // Under TCG the manager's default limit (a restored guest's CPU grows with the guests
      // running beside it); under KVM a child's guest part is a millisecond, so its children
      // all run at once, as before.
      forkRunAtOnce: config.forkRunAtOnce ?? (parts.accel === 'tcg' ? undefined : 0),
      poolWarmFiles: config.poolWarmFiles,
      hostFree: cachedHostFree(config.dataDir),
      records: cluster
        ? {
            sandboxes: cluster.sandboxRecords(sandboxRecords),
            snapshots: cluster.snapshotRecords(snapshotRecords),
          }
        : { sandboxes: sandboxRecords, snapshots: snapshotRecords },
      idleAction: config.idleAction,
      pausedTtlS: config.pausedTtlS,
      maxStorageMib: config.maxStorageMib,
      maxFileBytes: config.maxFileBytes,
      egress: parts.ports,
      ...(cluster
        ? {
            cluster: {
              nodeId: cluster.id,
              ensureConnected: () => cluster.ensureConnected(),
              confirmSandboxes: (ids: readonly string[]) => cluster.confirmSandboxes(ids),
              confirmSnapshot: (id: string) => cluster.confirmSnapshot(id),
              fetchSnapshot: (id: string) => cluster.fetchSnapshot(id),
            },
          }
        : {}),
    },
    hypervisor,
    log,
    metrics.observer,
  );
  return { manager, sandboxRecords };
}

/** What the cluster sees of this node: its sandboxes, capacity, load and templates. */
function clusterView(
  config: Config,
  manager: SandboxManager,
  sizing: SandboxSizing,
): LocalSandboxes {
  return {
    holds: (id) => manager.holds(id),
    holdsSnapshot: (id) => manager.holdsSnapshot(id),
    snapshotIds: () => manager.snapshotIds(),
    fence: (id, why) => manager.fence(id, why),
    fenceSnapshot: (id, why) => manager.fenceSnapshot(id, why),
    capacity: () => ({ sandboxes: sizing.maxSandboxes, memory_mib: Math.round(hostMemTotalMib()) }),
    load: () => ({
      sandboxes: manager.count,
      memory_free_mib: Math.round(hostFree(config.dataDir).memAvailableMib),
    }),
    templates: () =>
      Object.fromEntries(
        manager.listTemplates().map((t) => [t.name, { state: t.state, build: t.image_key }]),
      ),
  };
}

/** The HTTP servers: the native API, and the E2B-compatible front (docs/e2b.md) unless off. */
interface Servers {
  readonly app: FastifyInstance;
  readonly e2b: FastifyInstance | null;
}

async function buildServers(
  config: Config,
  parts: {
    manager: SandboxManager;
    auth: AuthMode;
    log: Logger;
    metrics: Metrics;
    cluster: ClusterNode | null;
    moves: Moves | null;
  },
): Promise<Servers> {
  const { manager, auth, log, metrics, cluster, moves } = parts;
  const app = await buildServer({
    manager,
    auth,
    maxBodyBytes: config.maxBodyBytes,
    maxFileBytes: config.maxFileBytes,
    logger: log,
    metrics,
    mcp: { sessionEnd: config.mcpSessionEnd, idleTimeoutS: config.mcpSessionIdleS },
    ...(cluster
      ? {
          cluster: {
            node: cluster,
            drain: () =>
              void moves?.drainer
                .drain()
                .catch((err: unknown) => log.warn({ err }, 'the drain failed')),
            undrain: () => (moves ? moves.drainer.undrain() : cluster.setState('serving')),
            ...(moves
              ? { peer: { key: config.cluster!.key, handOver: moves.handOver, manager } }
              : {}),
          },
        }
      : {}),
  });
  // The E2B-compatible front, on its own port, over the same manager.
  const e2b = config.e2bAddr
    ? await buildE2bServer({
        manager,
        auth,
        tokens: cluster
          ? await SandboxTokens.ofClusterNode(config.dataDir, cluster, log)
          : await SandboxTokens.load(join(config.dataDir, 'e2b-token-secret')),
        maxBodyBytes: config.maxBodyBytes,
        maxFileBytes: config.maxFileBytes,
        logger: log,
        ...(cluster ? { cluster } : {}),
        ...(moves
          ? {
              room: {
                pausedWithoutRoom: (id: string) => manager.pausedWithoutRoom(id),
                moveToRoom: (id: string, template: string) =>
                  moves.handOver.moveToRoom(id, template),
              },
            }
          : {}),
      })
    : null;
  return { app, e2b: e2b?.app ?? null };
}

/**
 * On SIGTERM/SIGINT: destroy every VM, close the servers, release the directories, exit 0.
 * Returns the same stop for the start's own failures; it runs once however often it is called.
 */
function stopOnSignals(
  config: Config,
  parts: {
    manager: SandboxManager;
    /** Its file opened ahead is closed and removed at the stop (FileRecords.closeAhead). */
    sandboxRecords: FileRecords<SandboxRecord>;
    cluster: ClusterNode | null;
    moves: Moves | null;
    servers: Servers;
    log: Logger;
  },
): (signal: string) => Promise<void> {
  const { manager, sandboxRecords, cluster, moves, servers, log } = parts;
  let stopping: Promise<void> | null = null;
  const stop = (signal: string): Promise<void> =>
    (stopping ??= (async () => {
      // Cluster mode: SIGTERM (a service manager's stop, a rolling restart) hands the sandboxes
      // to other nodes first, bounded in time; what is left is paused in place below and comes
      // back with the node. SIGINT (Ctrl-C, a whole cluster stopped at once) pauses in place.
      // Either way the node is `draining` from now on (the manager refuses creates from its
      // shutdown on) and an undrain is refused: `serving` would place creates on a node going.
      // Set at once; its publish is not waited for (etcd unreachable must not delay the stop).
      void cluster
        ?.leave()
        .catch((err: unknown) => log.warn({ err }, 'could not publish that the node stops'));
      if (moves && signal === 'SIGTERM') await drainFor(moves, config, log);
      log.info({ signal }, 'shutting down: destroying all VMs');
      await manager.shutdown();
      await cluster?.stop();
      moves?.peers.close();
      await servers.app
        .close()
        .catch((err: unknown) => log.warn({ err }, 'closing the HTTP server failed'));
      await servers.e2b
        ?.close()
        .catch((err: unknown) => log.warn({ err }, 'closing the E2B server failed'));
      // Nothing writes a record any more: the spare file goes, not left for the next start.
      sandboxRecords.closeAhead();
      await releaseStateDir(config.stateDir);
      await releaseDataDir(config.dataDir);
      log.info('stopped');
    })());
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.once(sig, () => void stop(sig).finally(() => process.exit(0)));
  }
  return stop;
}

/** Cluster mode's moving of sandboxes between nodes (docs/cluster.md, Drain and hand-over). */
interface Moves {
  readonly peers: HttpPeers;
  readonly handOver: HandOver;
  readonly drainer: Drainer;
}

function movesOf(
  config: Config,
  cluster: ClusterNode,
  manager: SandboxManager,
  log: Logger,
): Moves {
  const peers = new HttpPeers({
    self: cluster.id,
    clusterKey: config.cluster!.key,
    apiKey: config.apiKeys[0] ?? null,
  });
  const handOver = new HandOver(cluster, manager, peers, log);
  cluster.bindCopies(new SnapshotCopies(cluster, manager, peers, log));
  return { peers, handOver, drainer: new Drainer(cluster, manager, handOver, log) };
}

/** The drain of a stopping node, for at most SERVICE_DRAIN_TIMEOUT_S. */
async function drainFor(moves: Moves, config: Config, log: Logger): Promise<void> {
  const timeoutS = config.cluster!.drainTimeoutS;
  if (timeoutS === 0) return;
  log.info({ timeoutS }, 'draining before the stop: handing sandboxes to other nodes');
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), timeoutS * 1000);
  });
  const result = await Promise.race([moves.drainer.drain(), timedOut])
    .catch((err: unknown) => {
      log.warn({ err }, 'the drain failed; what is left is paused in place');
      return 'failed' as const;
    })
    .finally(() => clearTimeout(timer));
  if (result === 'timeout')
    log.warn({ timeoutS }, 'the drain did not end in time; pausing the rest in place');
}

/** Boots (or re-adopts) the templates' VMs; a failure stops hostd with exit status 1. */
async function bootTemplates(
  manager: SandboxManager,
  stop: (signal: string) => Promise<void>,
  log: Logger,
): Promise<void> {
  try {
    await manager.start();
  } catch (err) {
    log.error({ err }, 'could not boot the templates');
    await stop('startup-failure');
    process.exit(1);
  }
}

/**
 * Listens: the E2B front first, so that both serve once hostd.url exists. Returns both
 * addresses (the E2B front's null when it is off); a port in use stops hostd with exit status 1,
 * leaving no VM behind.
 */
async function listen(
  config: Config,
  servers: Servers,
  ports: ApiPorts,
  stop: (signal: string) => Promise<void>,
  log: Logger,
): Promise<{ address: string; e2bAddress: string | null }> {
  let address: string;
  let e2bAddress: string | null = null;
  try {
    if (servers.e2b && config.e2bAddr) {
      const { host, port } = config.e2bAddr;
      e2bAddress = await servers.e2b.listen({ host, port });
      ports.e2bPort = Number(new URL(e2bAddress).port) || port;
      await writeFile(join(config.stateDir, 'e2b.url'), `${e2bAddress}\n`, { mode: 0o600 });
      log.info({ address: e2bAddress }, `E2B-compatible API listening on ${e2bAddress}`);
    }
    address = await servers.app.listen({ host: config.host, port: config.port });
  } catch (err) {
    log.error({ err }, 'could not listen');
    process.stderr.write(`hostd: could not listen: ${(err as Error).message}\n`);
    await stop('listen-failure');
    process.exit(1);
  }
  const { port } = new URL(address);
  ports.apiPort = port ? Number(port) : config.port;
  return { address, e2bAddress };
}

/**
 * This hostd as a cluster node: its id (SERVICE_NODE_ID, else one kept in the data directory so
 * that a restart is the same node) and its etcd client.
 */
async function clusterNode(config: Config, log: Logger): Promise<ClusterNode> {
  const settings = config.cluster!;
  if (!settings.nodeUrl && ['0.0.0.0', '::', ''].includes(config.host)) {
    throw new ConfigError(
      'SERVICE_NODE_URL must say how peers reach this node when SERVICE_HOSTD_ADDR binds every address',
    );
  }
  let id = settings.nodeId;
  if (!id) {
    const file = join(config.dataDir, 'node-id');
    id = (await readFile(file, 'utf8').catch(() => '')).trim();
    if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(id)) {
      id = `node-${randomBytes(4).toString('hex')}`;
      await writeFile(file, `${id}\n`, { mode: 0o600 });
    }
  }
  // Loaded here, not imported at the top: etcd's client (gRPC, protobufjs) takes a fifth of a
  // second to load, which every start outside cluster mode would wait for for nothing.
  const { EtcdKv } = await import('./cluster/etcd-kv.js');
  const kv = new EtcdKv({ endpoints: settings.etcd });
  log.info({ node: id, etcd: settings.etcd }, 'cluster mode');
  return new ClusterNode(kv, {
    id,
    url: '',
    version: HOSTD_VERSION,
    ttlS: settings.ttlS,
    log,
  });
}

/** Every address of this host's interfaces: hostd's API port is closed to sandboxes on all. */
function hostAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((a) => a.address));
}
