/**
 * hostd's entry point: read configuration, claim the state directory, boot the templates,
 * serve HTTP, and on SIGTERM/SIGINT destroy every VM and leave nothing behind.
 */
import { pino, type Logger } from 'pino';
import { ConfigError, isLoopback, loadConfig, type Config } from './config.js';
import { exitOnUncaught } from './fail-fast.js';
import { authMode } from './api/auth.js';
import { createMetrics } from './api/metrics.js';
import { buildServer } from './api/server.js';
import { SandboxTokens } from './api/e2b/auth.js';
import { buildE2bServer } from './api/e2b/server.js';
import { sandboxCapFor } from './core/admission.js';
import { hostFree, hostMemTotalMib } from './core/host-resources.js';
import { FileRecords, type SandboxRecord } from './core/journal.js';
import { SandboxManager } from './core/sandbox-manager.js';
import { chooseAccel, hostTscKhz } from './vm/qemu/accel.js';
import { QemuHypervisor } from './vm/qemu/hypervisor.js';
import { guestImageOf } from './vm/image/image.js';
import { CachedTemplateImages } from './vm/image/template-images.js';
import { BUILTIN_RECIPE_DIR, loadRecipes } from './core/recipe.js';
import { planTemplates, UnknownRecipeError } from './core/template-plan.js';
import { capstoneStandIn } from './vm/host/capstone-stand-in.js';
import { noHugePagesLauncher } from './vm/host/huge-pages.js';
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
import { EtcdKv } from './cluster/etcd-kv.js';
import { ClusterNode } from './core/cluster/cluster-node.js';
import type { RecordStore, SnapshotRecord } from './core/journal.js';
import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import { join } from 'node:path';

const HOSTD_VERSION = '0.1.0';

async function main(): Promise<void> {
  let config: Config;
  let auth;
  try {
    config = loadConfig();
    auth = authMode({
      apiKeys: config.apiKeys,
      authDisabled: config.authDisabled,
      // The E2B front runs code for whoever reaches it too: both binds must be loopback.
      loopback: isLoopback(config.host) && (!config.e2bAddr || isLoopback(config.e2bAddr.host)),
    });
  } catch (err) {
    process.stderr.write(`hostd: ${(err as Error).message}\n`);
    process.exit(2);
  }
  const log = pino({
    level: config.logLevel,
    base: { service: 'hostd' },
    redact: {
      paths: [
        'req.headers.authorization',
        'req.headers["x-api-key"]',
        'req.headers["x-access-token"]',
        'apiKeys',
      ],
      censor: '[redacted]',
    },
  });
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

  // As root, each QEMU runs jailed as a uid of its own; as anyone else, as that same user.
  let vmUser: VmUser | undefined;
  let jail: VmJail | undefined;
  let makeJail: ((view: JailOptions['view']) => VmJail) | undefined;
  if (process.getuid?.() === 0) {
    vmUser = lookupUser(config.vmUser);
    if (!vmUser) {
      process.stderr.write(
        `hostd: running as root but the account "${config.vmUser}" (SERVICE_VM_USER) that QEMU should run as does not exist; create it with:\n  useradd --system --no-create-home --shell /usr/sbin/nologin ${config.vmUser}\n`,
      );
      process.exit(2);
    }
    const range = config.vmUidRange;
    const clash = accountsInRange(readFileSync('/etc/passwd', 'utf8'), range);
    if (clash.length) {
      process.stderr.write(
        `hostd: SERVICE_VM_UID_RANGE ${range.first}-${range.last} holds the accounts ${clash.join(', ')}; VMs need uids nobody else uses\n`,
      );
      process.exit(2);
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
    // Built once the directories are claimed and QEMU's libraries known (below).
    makeJail = (view) => new Jail(uids, gid, { namespaces: full, cgroups: cg.cgroups, view });
    log.info(
      {
        group: vmUser.name,
        uids: `${range.first}-${range.last}`,
        namespaces: full,
        cgroups: cg.cgroups?.version ?? null,
      },
      'each QEMU runs jailed as a uid of its own',
    );
  } else {
    log.warn(
      'hostd does not run as root: QEMUs run as its own user, unjailed (docs/operations.md, Security)',
    );
  }
  // A bug leaves hostd in an unknown state: it logs and exits (src/fail-fast.ts); its VMs run
  // on, and the next start re-adopts them.
  exitOnUncaught(log);
  // Both checked before either is touched: a refused start leaves a running hostd as it was.
  await ensureDirsFree(config.stateDir, config.dataDir);
  await claimStateDir(config.stateDir, vmUser?.gid);
  await claimDataDir(config.dataDir, vmUser?.gid);
  const accel = chooseAccel(config.accel);
  log.info({ accel: accel.accel, reason: accel.reason }, 'accelerator chosen');
  const tscKhz = hostTscKhz();
  if (process.env.SERVICE_IMAGE_DIR) {
    log.warn('SERVICE_IMAGE_DIR is not read any more: each template is served from its own build');
  }
  const recipes = await loadRecipes([
    BUILTIN_RECIPE_DIR,
    ...(config.templateDir ? [config.templateDir] : []),
  ]);
  let templates;
  try {
    templates = planTemplates(recipes, config.templates, config.templateDefaults);
  } catch (err) {
    if (!(err instanceof UnknownRecipeError)) throw err;
    process.stderr.write(`hostd: ${err.message}\n`);
    process.exit(2);
  }
  const images = new CachedTemplateImages({
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

  // Host memory of an idle sandbox that has run code, measured by the bench (bench/density.ts):
  // QEMU's heap, its other anonymous memory, the guest pages written since the restore and its
  // libraries' private data come to ~13 MiB (14 leaves room for a guest that wrote more); under
  // TCG, the part of the translation buffer an idle VM has filled (~11.5 MiB, whatever the
  // buffer's size) on top. A sandbox that grows past this is held back by the memory check, not
  // by the count.
  const perVmMib = 14 + (accel.accel === 'tcg' ? Math.min(config.tcgTbMib, 12) : 0);
  const maxSandboxes = config.maxSandboxes ?? sandboxCapFor(hostMemTotalMib(), perVmMib);
  log.info({ maxSandboxes, perVmMib, fromHostMemory: config.maxSandboxes === null }, 'sandbox cap');
  const ksm = enableKsm(config.ksm && process.getuid?.() === 0);
  log.info(ksm, 'kernel same-page merging (SERVICE_KSM)');
  const standIn = config.qemuCapstone
    ? { dir: null, why: 'SERVICE_QEMU_CAPSTONE=1' }
    : capstoneStandIn(config.cacheDir, config.qemuBinary);
  log.info(standIn, "QEMU's stand-in for libcapstone (SERVICE_QEMU_CAPSTONE)");
  if (makeJail) {
    const view = jailView({
      vmsDir: join(config.stateDir, 'vms'),
      dataDir: config.dataDir,
      tablePath: join(config.stateDir, 'jail-hidden.fstab'),
      qemuBinary: config.qemuBinary,
      needed: [
        config.stateDir,
        config.dataDir,
        config.cacheDir,
        ...(config.templateDir ? [config.templateDir] : []),
        ...(standIn.dir !== null ? [standIn.dir] : []),
      ],
    });
    log.info({ hidden: view.hide }, "each jailed QEMU's mount namespace hides these folders");
    jail = makeJail({ vmsDir: view.vmsDir, table: view.table });
  }
  const hypervisor = new QemuHypervisor(
    {
      qemuBinary: config.qemuBinary,
      vmsDir: join(config.stateDir, 'vms'),
      launcher: [...(accel.accel === 'tcg' && !config.tcgHugePages ? noHugePagesLauncher() : [])],
      ...(jail ? { jail } : {}),
      ...(standIn.dir !== null ? { env: { LD_LIBRARY_PATH: standIn.dir } } : {}),
    },
    config.dataDir,
    (_template, shape, image) => ({
      image: {
        ...guestImageOf(image),
        ...(config.tcgCpu === null ? {} : { tcgCpu: config.tcgCpu }),
      },
      memoryMib: shape.memoryMib,
      vcpus: shape.vcpus,
      accel: accel.accel,
      tcgTbMib: config.tcgTbMib,
      tscKhz,
    }),
    perVmMib,
  );
  await hypervisor.init();
  // The API's port is known once it listens (SERVICE_HOSTD_ADDR may ask for port 0).
  let apiPort = config.port;
  let e2bPort: number | null = null;
  const egress = {
    get apiPort(): number {
      return apiPort;
    },
    get otherApiPorts(): number[] {
      return e2bPort === null ? [] : [e2bPort];
    },
    hostAddresses: hostAddresses(),
  };
  const metrics = createMetrics({ accel: accel.accel, version: HOSTD_VERSION });
  // Cluster mode (SERVICE_CLUSTER_ETCD): this node's records are mirrored into etcd's catalog.
  const cluster = config.cluster ? await clusterNode(config, log) : null;
  const sandboxRecords = new FileRecords<SandboxRecord>(
    join(config.dataDir, 'sandboxes'),
    // A running sandbox's VM does not outlive the host: only paused and lost ones must.
    (r) => r.state !== 'running',
  );
  const snapshotRecords: RecordStore<SnapshotRecord> = new FileRecords(
    join(config.dataDir, 'snapshots'),
  );
  const manager = new SandboxManager(
    {
      templates,
      images,
      maxSandboxes,
      maxQueuedExecs: config.maxQueuedExecs,
      idleTimeoutS: config.idleTimeoutS,
      minFreeMib: config.minFreeMib,
      maxExecOutputBytes: config.maxExecOutputBytes,
      forkStandbyMax: config.forkStandbyMax,
      hostFree: () => hostFree(config.dataDir),
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
      egress,
      ...(cluster
        ? {
            cluster: {
              nodeId: cluster.id,
              ensureConnected: () => cluster.ensureConnected(),
              confirmSandboxes: (ids: readonly string[]) => cluster.confirmSandboxes(ids),
              confirmSnapshot: (id: string) => cluster.confirmSnapshot(id),
            },
          }
        : {}),
    },
    hypervisor,
    log,
    metrics.observer,
  );
  metrics.bind(manager);
  cluster?.bind({
    holds: (id) => manager.holds(id),
    holdsSnapshot: (id) => manager.holdsSnapshot(id),
    fence: (id, why) => manager.fence(id, why),
    fenceSnapshot: (id, why) => manager.fenceSnapshot(id, why),
    capacity: () => ({ sandboxes: maxSandboxes, memory_mib: Math.round(hostMemTotalMib()) }),
    load: () => ({
      sandboxes: manager.count,
      memory_free_mib: Math.round(hostFree(config.dataDir).memAvailableMib),
    }),
    templates: () =>
      Object.fromEntries(
        manager.listTemplates().map((t) => [t.name, { state: t.state, build: t.image_key }]),
      ),
  });

  let stopping: Promise<void> | null = null;
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
            // Drain, this far: stop taking creates (hand-over of sandboxes is not built yet).
            drain: () =>
              void cluster
                .setState('draining')
                .catch((err: unknown) => log.warn({ err }, 'starting the drain failed')),
          },
        }
      : {}),
  });
  // The E2B-compatible front (docs/e2b.md), on its own port, over the same manager.
  const e2b = config.e2bAddr
    ? await buildE2bServer({
        manager,
        auth,
        tokens: await SandboxTokens.load(join(config.dataDir, 'e2b-token-secret')),
        maxBodyBytes: config.maxBodyBytes,
        maxFileBytes: config.maxFileBytes,
        logger: log,
      })
    : null;
  const stop = (signal: string): Promise<void> =>
    (stopping ??= (async () => {
      log.info({ signal }, 'shutting down: destroying all VMs');
      await manager.shutdown();
      await cluster?.stop();
      await app
        .close()
        .catch((err: unknown) => log.warn({ err }, 'closing the HTTP server failed'));
      await e2b?.app
        .close()
        .catch((err: unknown) => log.warn({ err }, 'closing the E2B server failed'));
      await releaseStateDir(config.stateDir);
      await releaseDataDir(config.dataDir);
      log.info('stopped');
    })());
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.once(sig, () => void stop(sig).finally(() => process.exit(0)));
  }

  try {
    await manager.start();
  } catch (err) {
    log.error({ err }, 'could not boot the templates');
    await stop('startup-failure');
    process.exit(1);
  }
  let address: string;
  try {
    // The E2B front listens first: once hostd.url exists, both serve.
    if (e2b && config.e2bAddr) {
      const { host, port } = config.e2bAddr;
      const e2bAddress = await e2b.app.listen({ host, port });
      e2bPort = Number(new URL(e2bAddress).port) || port;
      await writeFile(join(config.stateDir, 'e2b.url'), `${e2bAddress}\n`, { mode: 0o600 });
      log.info({ address: e2bAddress }, `E2B-compatible API listening on ${e2bAddress}`);
    }
    address = await app.listen({ host: config.host, port: config.port });
  } catch (err) {
    // A port in use: say which, and leave no VM behind.
    log.error({ err }, 'could not listen');
    process.stderr.write(`hostd: could not listen: ${(err as Error).message}\n`);
    await stop('listen-failure');
    process.exit(1);
  }
  const { port } = new URL(address);
  apiPort = port ? Number(port) : config.port;
  if (cluster) {
    // Joins once it serves: peers may forward to it as soon as its record appears.
    cluster.url = config.cluster?.nodeUrl ?? address;
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
