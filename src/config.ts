/**
 * Server configuration, read once from `SERVICE_*` environment variables at start-up.
 * Every variable is documented in docs/operations.md; a bad value stops hostd with a
 * message naming the variable, before anything is started.
 */
import { createHash } from 'node:crypto';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_VM_UID_RANGE, parseIdRange, type IdRange } from './vm/host/vm-uids.js';

export type AccelChoice = 'auto' | 'kvm' | 'tcg';

/**
 * One template of SERVICE_TEMPLATES: served from the recipe of its name (or `recipe`), with the
 * resources it overrides; what it leaves out comes from the recipe's `[vm]` section.
 */
export interface TemplateConfig {
  readonly name: string;
  readonly recipe?: string;
  readonly memoryMib?: number;
  readonly vcpus?: number;
  readonly poolSize?: number;
}

/** Resources set for every template (SERVICE_VM_MEMORY_MIB, ...), over the recipes' own. */
export interface TemplateDefaults {
  readonly memoryMib?: number;
  readonly vcpus?: number;
  readonly poolSize?: number;
}

export interface Config {
  readonly host: string;
  readonly port: number;
  /**
   * Where the E2B-compatible front listens (SERVICE_E2B_ADDR, docs/e2b.md), or null when it is
   * off. By default the native API's host on port 49982, or port 0 when the native API asks for
   * port 0 (tests and scripts that start many hostds: each gets free ports for both).
   */
  readonly e2bAddr: { readonly host: string; readonly port: number } | null;
  readonly apiKeys: readonly string[];
  readonly authDisabled: boolean;
  /** Runtime files (tmpfs): VM sockets and logs, pid files. Survives a crash, not a reboot. */
  readonly stateDir: string;
  /** Durable state (disk): frozen templates, VM memory images, snapshots, paused sandboxes. */
  readonly dataDir: string;
  /** Where template images are built and found (SERVICE_CACHE_DIR). */
  readonly cacheDir: string;
  /** The user's recipes (SERVICE_TEMPLATE_DIR), next to the built-in templates/; '' for none. */
  readonly templateDir: string;
  readonly accel: AccelChoice;
  readonly tcgTbMib: number;
  /**
   * The guest CPU model under TCG (SERVICE_TCG_CPU) in place of the template manifest's
   * `tcg.cpu`; null keeps the manifest's. For measuring models: OpenBLAS's kernels follow the
   * CPU's flags (guest/agent/cpu_quirks.py). Never used under KVM, where the guest gets `host`.
   */
  readonly tcgCpu: string | null;
  /** Let TCG VMs use transparent huge pages (SERVICE_TCG_HUGE_PAGES=1); off: vm/host/memory-flags.ts. */
  readonly tcgHugePages: boolean;
  /** Turn the host's KSM on at start when hostd is root (SERVICE_KSM, default on): vm/host/ksm.ts. */
  readonly ksm: boolean;
  /**
   * What KSM may merge in a QEMU (SERVICE_KSM_SCOPE): `qemu` (default) every anonymous page,
   * through PR_SET_MEMORY_MERGE in the launcher; `guest-ram` only the guest RAM QEMU marks
   * mergeable itself. vm/host/memory-flags.ts, docs/architecture.md (Density).
   */
  readonly ksmScope: 'qemu' | 'guest-ram';
  /** The templates to serve, in order; null: every recipe, `python` first. */
  readonly templates: readonly TemplateConfig[] | null;
  /** Resource overrides for every template, when the SERVICE_VM_* variables are set. */
  readonly templateDefaults: TemplateDefaults;
  /**
   * Sandboxes alive at once; null (SERVICE_MAX_SANDBOXES unset or `auto`) makes the cap follow
   * host memory (core/admission.ts `sandboxCapFor`), so a bigger host holds more without tuning.
   */
  readonly maxSandboxes: number | null;
  readonly maxBodyBytes: number;
  /** Largest file upload (SERVICE_MAX_FILE_BYTES); uploads stream, so it is not held in memory. */
  readonly maxFileBytes: number;
  readonly maxQueuedExecs: number;
  /** Seconds without any request after which a sandbox is paused or deleted; 0 disables. */
  readonly idleTimeoutS: number;
  /** What the idle timeout does to a sandbox. */
  readonly idleAction: 'pause' | 'delete';
  /** Seconds a paused sandbox is kept before it is deleted; 0 keeps it until deleted. */
  readonly pausedTtlS: number;
  /** MiB snapshots and paused sandboxes may take on disk; past it they get 507. 0: no cap. */
  readonly maxStorageMib: number;
  /** Memory and data-dir space (MiB) that must stay free after starting a VM. */
  readonly minFreeMib: number;
  /** Output (bytes of event data) one exec may produce before it is interrupted. */
  readonly maxExecOutputBytes: number;
  /** Most QEMUs started ahead per template for forks (core/fork-standby.ts); 0: none. */
  readonly forkStandbyMax: number;
  /**
   * How many of a fork's children run their guest at once (core/lineage.ts); unset: twice the
   * host's cores under TCG, all at once under KVM (main.ts); 0: all at once.
   */
  readonly forkRunAtOnce: number | undefined;
  /** Warm pool machines' files path too (SERVICE_POOL_WARM_FILES=1): core/pool.ts `warm`. */
  readonly poolWarmFiles: boolean;
  readonly logLevel: string;
  readonly qemuBinary: string;
  /** Load Debian's libcapstone in QEMU (SERVICE_QEMU_CAPSTONE=1); off: vm/host/capstone-stand-in.ts. */
  readonly qemuCapstone: boolean;
  /**
   * The account whose group every jailed QEMU is in, to read images (SERVICE_VM_USER, default
   * hostd-vm); each QEMU runs as its own uid from `vmUidRange`.
   */
  readonly vmUser: string;
  /** Uids (and gids) handed to VMs one each when hostd is root (SERVICE_VM_UID_RANGE). */
  readonly vmUidRange: IdRange;
  /**
   * How QEMU is jailed when hostd is root (SERVICE_VM_JAIL): `full` (namespaces and a cgroup
   * leaf too, the default) or `uid` (its own uid only; for comparison in the bench).
   */
  readonly vmJail: 'full' | 'uid';
  /** What ending an MCP session on /mcp does to the sandboxes it created (SERVICE_MCP_SESSION_END). */
  readonly mcpSessionEnd: 'delete' | 'pause' | 'keep';
  /** Seconds an MCP session with no request open lives on; 0 never expires (SERVICE_MCP_SESSION_IDLE_S). */
  readonly mcpSessionIdleS: number;
  /** Cluster mode (SERVICE_CLUSTER_ETCD set); null: a single hostd, as without it. */
  readonly cluster: ClusterConfig | null;
  /** Variables hostd no longer reads that are set (RETIRED_VARS): main warns of each. */
  readonly retired: readonly RetiredVar[];
}

/** A variable hostd once read, and what replaced it, for the warning when it is still set. */
export interface RetiredVar {
  readonly name: string;
  readonly why: string;
}

/** Variables hostd no longer reads: set, they are ignored with a warning rather than refused. */
export const RETIRED_VARS: readonly RetiredVar[] = [
  { name: 'SERVICE_IMAGE_DIR', why: 'each template is served from its own build' },
];

/** Cluster mode's settings (docs/operations.md, Cluster mode). */
export interface ClusterConfig {
  /** etcd's client URLs (SERVICE_CLUSTER_ETCD). */
  readonly etcd: readonly string[];
  /** This node's id (SERVICE_NODE_ID); null: the one kept in the data directory. */
  readonly nodeId: string | null;
  /** Where peers and the proxy reach this node (SERVICE_NODE_URL); null: from the address. */
  readonly nodeUrl: string | null;
  /** Lease TTL in seconds (SERVICE_CLUSTER_TTL_S): how soon a dead node's sandboxes are lost. */
  readonly ttlS: number;
  /**
   * The secret of routes between nodes (file transfers, hand-overs): SERVICE_CLUSTER_KEY, else
   * one derived from SERVICE_API_KEYS (which every node shares).
   */
  readonly key: string;
  /** Seconds a SIGTERM waits for the drain before it stops (SERVICE_DRAIN_TIMEOUT_S). */
  readonly drainTimeoutS: number;
}

/** Thrown for an unusable configuration; main prints it and exits non-zero. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

type Env = Record<string, string | undefined>;

function intVar(env: Env, name: string, fallback: number, min: number, max: number): number {
  return optionalInt(env, name, min, max) ?? fallback;
}

/** The variable as a whole number in [min, max], or undefined when it is unset or empty. */
function optionalInt(env: Env, name: string, min: number, max: number): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  return wholeNumber(name, raw, min, max);
}

/** `raw` as a whole number in [min, max], or a ConfigError naming `what`. */
function wholeNumber(what: string, raw: string, min: number, max: number): number {
  if (!/^\d+$/.test(raw.trim()))
    throw new ConfigError(`${what} must be a whole number, got "${raw}"`);
  const value = Number(raw.trim());
  if (value < min || value > max) {
    throw new ConfigError(`${what} must be between ${min} and ${max}, got ${value}`);
  }
  return value;
}

/** One of `allowed`, or a ConfigError naming the variable. */
function choice<T extends string>(env: Env, name: string, allowed: readonly T[], fallback: T): T {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!(allowed as readonly string[]).includes(raw)) {
    throw new ConfigError(`${name} must be one of ${allowed.join(', ')}, got "${raw}"`);
  }
  return raw as T;
}

/**
 * The translation buffer of a restored VM under TCG, in MiB: smaller ones overflowed under the
 * data stack (a chart, a groupby), and each flush retranslated everything (docs/architecture.md,
 * "Measured choices in the code" and "Compute under TCG").
 */
export const DEFAULT_TCG_TB_MIB = 32;

/** SERVICE_TCG_CPU: a QEMU CPU model with optional `,+flag`/`,-flag`/`,key=value` parts. */
function tcgCpuVar(env: Env): string | null {
  const raw = env.SERVICE_TCG_CPU?.trim();
  if (raw === undefined || raw === '') return null;
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*(,[+-]?[A-Za-z0-9_.-]+(=[A-Za-z0-9_.-]+)?)*$/.test(raw)) {
    throw new ConfigError(
      `SERVICE_TCG_CPU must be a QEMU CPU model like "max" or "qemu64,+rdrand", got "${raw}"`,
    );
  }
  return raw;
}

/** Splits "host:port" and "[v6]:port"; a bare port binds loopback. */
export function parseAddr(
  addr: string,
  variable = 'SERVICE_HOSTD_ADDR',
): { host: string; port: number } {
  const match =
    /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(addr.trim()) ?? /^()()(\d+)$/.exec(addr.trim());
  if (!match) throw new ConfigError(`${variable} must look like host:port, got "${addr}"`);
  const host = match[1] || match[2] || '127.0.0.1';
  const port = Number(match[3]);
  if (port > 65535) throw new ConfigError(`${variable} port out of range: ${port}`);
  return { host, port };
}

/** The E2B front's port unless SERVICE_E2B_ADDR says otherwise (docs/e2b.md). */
export const E2B_DEFAULT_PORT = 49982;

/**
 * SERVICE_E2B_ADDR: `host:port` like SERVICE_HOSTD_ADDR, or `off` to serve no E2B front. Unset,
 * it listens on the native API's host, port 49982 (port 0 when the native API's port is 0).
 */
export function parseE2bAddr(
  raw: string | undefined,
  native: { host: string; port: number },
): { host: string; port: number } | null {
  if (raw === undefined || raw.trim() === '') {
    return { host: native.host, port: native.port === 0 ? 0 : E2B_DEFAULT_PORT };
  }
  if (raw.trim().toLowerCase() === 'off') return null;
  return parseAddr(raw, 'SERVICE_E2B_ADDR');
}

/** Loopback means only processes on this machine can connect: 127.0.0.0/8, ::1, localhost. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * `SERVICE_TEMPLATES` lists templates as `name[:mem=MiB][:cpus=N][:pool=N][:recipe=NAME]`,
 * comma-separated; the first is the default. Unset or empty: null (every recipe is served).
 */
export function parseTemplates(raw: string | undefined): TemplateConfig[] | null {
  if (!raw || raw.trim() === '') return null;
  const seen = new Set<string>();
  return raw.split(',').map((part) => {
    const [name = '', ...opts] = part.trim().split(':');
    if (!/^[a-z0-9][a-z0-9-]{0,31}$/.test(name)) {
      throw new ConfigError(`SERVICE_TEMPLATES: bad template name "${name}" (use a-z, 0-9, -)`);
    }
    if (seen.has(name)) throw new ConfigError(`SERVICE_TEMPLATES: template "${name}" listed twice`);
    seen.add(name);
    const t: { -readonly [K in keyof TemplateConfig]: TemplateConfig[K] } = { name };
    for (const opt of opts) {
      const eq = opt.indexOf('=');
      const [key, value] = eq < 0 ? [opt, ''] : [opt.slice(0, eq), opt.slice(eq + 1)];
      const what = `SERVICE_TEMPLATES: ${name}:${key}`;
      if (key === 'mem') t.memoryMib = wholeNumber(what, value, 128, 65536);
      else if (key === 'cpus') t.vcpus = wholeNumber(what, value, 1, 16);
      else if (key === 'pool') t.poolSize = wholeNumber(what, value, 0, 64);
      else if (key === 'recipe' && /^[a-z0-9][a-z0-9-]{0,62}$/.test(value)) t.recipe = value;
      else if (key === 'recipe') throw new ConfigError(`${what} must be a template name`);
      else throw new ConfigError(`SERVICE_TEMPLATES: unknown option "${opt}" for "${name}"`);
    }
    return t;
  });
}

/** SERVICE_CLUSTER_* as a ClusterConfig, or null when SERVICE_CLUSTER_ETCD is unset. */
export function parseCluster(env: Env): ClusterConfig | null {
  const raw = env.SERVICE_CLUSTER_ETCD?.trim();
  if (!raw) {
    for (const name of ['SERVICE_NODE_ID', 'SERVICE_NODE_URL', 'SERVICE_CLUSTER_KEY']) {
      if (env[name]) throw new ConfigError(`${name} is set but SERVICE_CLUSTER_ETCD is not`);
    }
    return null;
  }
  const etcd = raw.split(',').map((u) => u.trim());
  for (const u of etcd) {
    if (!/^https?:\/\/[^/\s]+\/?$/.test(u)) {
      throw new ConfigError(`SERVICE_CLUSTER_ETCD: "${u}" is not an http(s)://host:port URL`);
    }
  }
  const nodeId = env.SERVICE_NODE_ID?.trim() || null;
  if (nodeId !== null && !/^[a-z0-9][a-z0-9-]{0,62}$/.test(nodeId)) {
    throw new ConfigError(`SERVICE_NODE_ID must be a-z, 0-9 and -, got "${nodeId}"`);
  }
  const nodeUrl = env.SERVICE_NODE_URL?.trim().replace(/\/+$/, '') || null;
  if (nodeUrl !== null && !/^https?:\/\/[^/\s]+$/.test(nodeUrl)) {
    throw new ConfigError(`SERVICE_NODE_URL must be http(s)://host:port, got "${nodeUrl}"`);
  }
  const apiKeys = (env.SERVICE_API_KEYS ?? '')
    .split(',')
    .map((k) => k.trim())
    .filter((k) => k !== '')
    .sort();
  const key =
    env.SERVICE_CLUSTER_KEY?.trim() ||
    createHash('sha256')
      .update(`hostd-cluster-key\n${apiKeys.join('\n')}`)
      .digest('hex');
  return {
    etcd,
    nodeId,
    nodeUrl,
    ttlS: intVar(env, 'SERVICE_CLUSTER_TTL_S', 10, 2, 300),
    key,
    drainTimeoutS: intVar(env, 'SERVICE_DRAIN_TIMEOUT_S', 300, 0, 86400),
  };
}

/**
 * Where templates are built and found (SERVICE_CACHE_DIR). As root the default is outside any
 * home, because QEMU runs as an unprivileged account, which cannot read root's home.
 */
export function defaultCacheDir(env: Env = process.env): string {
  if (env.SERVICE_CACHE_DIR) return env.SERVICE_CACHE_DIR;
  return process.getuid?.() === 0 ? '/var/cache/hostd' : join(homedir(), '.cache', 'hostd');
}

/**
 * The settings of the template CLI (`npm run template`): only where recipes and images are, so
 * that a variable only hostd reads, set wrong, does not stop a build.
 */
export function loadTemplateSettings(env: Env = process.env): {
  readonly cacheDir: string;
  readonly templateDir: string;
} {
  return { cacheDir: defaultCacheDir(env), templateDir: env.SERVICE_TEMPLATE_DIR || '' };
}

/**
 * The whole configuration of hostd from `env`, validated: a bad value is a ConfigError naming
 * the variable, thrown before anything starts.
 */
export function loadConfig(env: Env = process.env): Config {
  const { host, port } = parseAddr(env.SERVICE_HOSTD_ADDR ?? '127.0.0.1:7070');
  const e2bAddr = parseE2bAddr(env.SERVICE_E2B_ADDR, { host, port });
  const apiKeys = (env.SERVICE_API_KEYS ?? '')
    .split(',')
    .map((k) => k.trim())
    .filter((k) => k !== '');
  const authDisabled = env.SERVICE_AUTH_DISABLED === '1';
  const accel = (env.SERVICE_ACCEL ?? 'auto') as AccelChoice;
  if (!['auto', 'kvm', 'tcg'].includes(accel)) {
    throw new ConfigError(`SERVICE_ACCEL must be auto, kvm or tcg, got "${accel}"`);
  }
  const uid = typeof process.getuid === 'function' ? process.getuid() : 0;
  const dataDir =
    env.SERVICE_DATA_DIR ||
    (uid === 0 ? '/var/lib/hostd' : join(homedir(), '.local', 'share', 'hostd'));
  const templates = parseTemplates(env.SERVICE_TEMPLATES);
  const memoryMib = optionalInt(env, 'SERVICE_VM_MEMORY_MIB', 128, 65536);
  const vcpus = optionalInt(env, 'SERVICE_VM_VCPUS', 1, 16);
  const poolSize = optionalInt(env, 'SERVICE_POOL_SIZE', 0, 64);
  return {
    host,
    port,
    e2bAddr,
    apiKeys,
    authDisabled,
    stateDir: env.SERVICE_STATE_DIR || `/dev/shm/hostd-${uid}`,
    dataDir,
    ...loadTemplateSettings(env),
    accel,
    tcgTbMib: intVar(env, 'SERVICE_TCG_TB_MIB', DEFAULT_TCG_TB_MIB, 4, 1024),
    tcgCpu: tcgCpuVar(env),
    tcgHugePages: env.SERVICE_TCG_HUGE_PAGES === '1',
    ksm: choice(env, 'SERVICE_KSM', ['on', 'off'] as const, 'on') === 'on',
    ksmScope: choice(env, 'SERVICE_KSM_SCOPE', ['qemu', 'guest-ram'] as const, 'qemu'),
    templates,
    templateDefaults: {
      ...(memoryMib === undefined ? {} : { memoryMib }),
      ...(vcpus === undefined ? {} : { vcpus }),
      ...(poolSize === undefined ? {} : { poolSize }),
    },
    maxSandboxes:
      env.SERVICE_MAX_SANDBOXES === 'auto'
        ? null
        : intVar(env, 'SERVICE_MAX_SANDBOXES', 0, 1, 65536) || null,
    maxBodyBytes: intVar(env, 'SERVICE_MAX_BODY_BYTES', 4 * 1024 * 1024, 1024, 256 * 1024 * 1024),
    maxFileBytes: intVar(env, 'SERVICE_MAX_FILE_BYTES', 4 * 1024 ** 3, 1024, 2 ** 40),
    maxQueuedExecs: intVar(env, 'SERVICE_MAX_QUEUED_EXECS', 64, 1, 100000),
    idleTimeoutS: intVar(env, 'SERVICE_IDLE_TIMEOUT_S', 3600, 0, 30 * 24 * 3600),
    idleAction: choice(env, 'SERVICE_IDLE_ACTION', ['pause', 'delete'] as const, 'pause'),
    pausedTtlS: intVar(env, 'SERVICE_PAUSED_TTL_S', 7 * 24 * 3600, 0, 365 * 24 * 3600),
    maxStorageMib: intVar(env, 'SERVICE_MAX_STORAGE_MIB', 51200, 0, 1 << 30),
    minFreeMib: intVar(env, 'SERVICE_MIN_FREE_MIB', 256, 0, 1 << 30),
    forkStandbyMax: intVar(env, 'SERVICE_FORK_STANDBY_MAX', 32, 0, 32),
    forkRunAtOnce: optionalInt(env, 'SERVICE_FORK_RUN_AT_ONCE', 0, 32),
    poolWarmFiles: env.SERVICE_POOL_WARM_FILES === '1',
    maxExecOutputBytes: intVar(
      env,
      'SERVICE_MAX_EXEC_OUTPUT_BYTES',
      64 * 1024 * 1024,
      1024,
      2 ** 40,
    ),
    logLevel: env.SERVICE_LOG_LEVEL || 'info',
    qemuBinary: env.SERVICE_QEMU_BINARY || 'qemu-system-x86_64',
    qemuCapstone: env.SERVICE_QEMU_CAPSTONE === '1',
    vmUser: env.SERVICE_VM_USER || 'hostd-vm',
    vmUidRange: uidRange(env.SERVICE_VM_UID_RANGE || DEFAULT_VM_UID_RANGE),
    vmJail: choice(env, 'SERVICE_VM_JAIL', ['full', 'uid'] as const, 'full'),
    mcpSessionEnd: choice(
      env,
      'SERVICE_MCP_SESSION_END',
      ['delete', 'pause', 'keep'] as const,
      'delete',
    ),
    mcpSessionIdleS: intVar(env, 'SERVICE_MCP_SESSION_IDLE_S', 3600, 0, 30 * 24 * 3600),
    cluster: parseCluster(env),
    retired: RETIRED_VARS.filter((v) => env[v.name]),
  };
}

function uidRange(text: string): IdRange {
  try {
    return parseIdRange(text);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
}
