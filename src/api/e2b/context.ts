/**
 * What every part of the E2B front shares (docs/e2b.md): the manager, the sandboxes' tokens,
 * the data-plane lookup that answers 502 for a sandbox that is not running, and the watch that
 * cuts a sandbox's open data-plane connections when it stops. The control plane (control.ts),
 * envd (envd.ts) and the code interpreter (interpreter.ts) get it as `ctx`.
 *
 * Data-plane routes do not look up or authorize the sandbox themselves: the front's hook does,
 * before the route runs (server.ts), by the route's `config.e2bToken` policy, and the route reads
 * the result with `ctx.sandboxOf(req)`.
 */
import type { Socket } from 'node:net';
import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { SandboxInfo, SandboxManager, StopListener } from '../../core/sandbox-manager.js';
import { fail, HostdError } from '../../errors.js';
import type { ClusterFront } from '../cluster-front.js';
import type { SandboxTokens } from './auth.js';

/** `E2b-Sandbox-Port` of envd (processes, filesystem, `/files`, `/health`). */
export const ENVD_PORT = 49983;
/** `E2b-Sandbox-Port` of the code interpreter (`/execute`, `/contexts`). */
export const INTERPRETER_PORT = 49999;

/**
 * The envd version the front reports (`envdVersion`): the SDKs gate features on it and never
 * ask envd itself (docs/e2b.md, envdVersion). At 0.6.4 every gate of the 2.x SDKs is open: the
 * front must then serve octet-stream and gzip uploads (0.5.7), file metadata (0.6.2) and watch
 * entries (0.6.3). A valid semver without pre-release part: `0.6.4-x` would compare lower.
 */
export const ENVD_VERSION = '0.6.4';

/**
 * The metadata label that keeps E2B's `lifecycle.autoResume` with the sandbox (docs/e2b.md):
 * `"true"` lets sandbox traffic resume a sandbox an E2B client paused. The E2B front hides it
 * from E2B's metadata; the native API shows it.
 */
export const AUTO_RESUME_LABEL = 'e2b.auto_resume';

/**
 * How an E2B client sees a hostd sandbox: `running`, `paused` (by a client or its lifetime:
 * sandbox traffic answers 502 until `connect`), or `gone` (failed). A sandbox hostd paused on
 * its own (idle, its own restart) is `running` to E2B: its next use resumes it, as natively.
 */
export function e2bState(info: SandboxInfo): 'running' | 'paused' | 'gone' {
  if (info.state === 'failed') return 'gone';
  if (info.state === 'ready') return 'running';
  return info.paused_by === 'request' || info.paused_by === 'lifetime' ? 'paused' : 'running';
}

/**
 * How a data-plane route is authorized, set per route as `config: { e2bToken }`:
 * - `access` (envd's default): `X-Access-Token` must be the sandbox's access token;
 * - `traffic` (the code interpreter's default): `X-Access-Token` or `E2B-Traffic-Access-Token`
 *   must be the sandbox's access or traffic token;
 * - `access-or-signature`: as `access` when the header is sent; without it the route checks a
 *   signature itself (`/files` URLs from uploadUrl()/downloadUrl(), fetched with no header at
 *   all: then `sandboxOf` may be null and the route finds the sandbox by its signature);
 * - `none`: no token (envd's `/health`); the sandbox must still be running.
 */
export type TokenPolicy = 'access' | 'traffic' | 'access-or-signature' | 'none';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** How the E2B front authorizes this data-plane route (context.ts, TokenPolicy). */
    e2bToken?: TokenPolicy;
  }
}

/** The running sandbox a data-plane request is for, as the front's hook found it. */
export interface DataPlaneSandbox {
  readonly id: string;
  /**
   * Its access tokens, the one issued first (api/e2b/auth.ts): what signatures of its `/files`
   * URLs are made with.
   */
  readonly accessTokens: readonly string[];
  /** False only under `access-or-signature` when no token header came: check the signature. */
  readonly tokenChecked: boolean;
}

export interface E2bContext {
  readonly manager: SandboxManager;
  /** Cluster mode: places creates across the nodes (cluster-hop.ts forwards the rest); else null. */
  readonly cluster: ClusterFront | null;
  readonly log: Logger;
  readonly tokens: SandboxTokens;
  /** `envdVersion` in every sandbox answer. */
  readonly envdVersion: string;
  /** SERVICE_MAX_BODY_BYTES and SERVICE_MAX_FILE_BYTES. */
  readonly maxBodyBytes: number;
  readonly maxFileBytes: number;
  /**
   * The sandbox this data-plane request is for. Null only on an `access-or-signature` route
   * called without `E2b-Sandbox-Id` (a signed URL): find it with `runningSandboxes()`.
   */
  sandboxOf(req: FastifyRequest): DataPlaneSandbox | null;
  /** Every running sandbox, with its access token (to find the one a signature was made for). */
  runningSandboxes(): DataPlaneSandbox[];
  /**
   * Throws `sandbox_not_running` (502, what E2B's proxy answers) unless `id` is a running
   * sandbox as E2B sees it (`e2bState`): unknown, deleted, expired, failed and client-paused
   * sandboxes are all "not found" to E2B, but a client-paused one created with E2B's
   * `autoResume` passes (its route's first manager call resumes it, as any native call does).
   */
  requireRunning(id: string): void;
  /**
   * Cuts `socket` (destroys it: the client sees a reset, not a clean end) when sandbox `id`
   * stops running, so an SDK waiting on a stream learns that the sandbox was killed. The front
   * does this for every data-plane request until its answer is sent; call it for what outlives
   * that. Returns the function that stops watching.
   */
  cutOnStop(id: string, socket: Socket): () => void;
  /** Calls `listener` when a sandbox stops running (manager.onSandboxStopped). */
  onSandboxStopped(listener: StopListener): () => void;
}

/** Sockets to cut per sandbox, cut when the manager says the sandbox stopped. */
export class StopWatch {
  private readonly sockets = new Map<string, Set<Socket>>();

  constructor(manager: SandboxManager) {
    manager.onSandboxStopped((id) => this.cut(id));
  }

  watch(id: string, socket: Socket): () => void {
    let set = this.sockets.get(id);
    if (!set) this.sockets.set(id, (set = new Set()));
    set.add(socket);
    return () => {
      const s = this.sockets.get(id);
      if (!s) return;
      s.delete(socket);
      if (s.size === 0) this.sockets.delete(id);
    };
  }

  /** Destroys every watched socket of sandbox `id`. */
  cut(id: string): number {
    const set = this.sockets.get(id);
    if (!set) return 0;
    this.sockets.delete(id);
    for (const socket of set) socket.destroy();
    return set.size;
  }
}

/** Builds the context; `sandboxOf` reads what the front's hook stored for each request. */
export function makeContext(opts: {
  manager: SandboxManager;
  log: Logger;
  tokens: SandboxTokens;
  maxBodyBytes: number;
  maxFileBytes: number;
  resolved: WeakMap<object, DataPlaneSandbox | null>;
  stopWatch: StopWatch;
  cluster?: ClusterFront | null;
}): E2bContext {
  const { manager, tokens, resolved, stopWatch } = opts;
  const requireRunning = (id: string): void => {
    let info: SandboxInfo;
    try {
      info = manager.describe(id);
    } catch (err) {
      if (err instanceof HostdError && err.status >= 500) throw err;
      throw fail('sandboxNotRunning', id);
    }
    const state = e2bState(info);
    if (state === 'running') return;
    if (state === 'paused' && info.metadata[AUTO_RESUME_LABEL] === 'true') return;
    throw fail('sandboxNotRunning', id);
  };
  return {
    manager,
    cluster: opts.cluster ?? null,
    log: opts.log,
    tokens,
    envdVersion: ENVD_VERSION,
    maxBodyBytes: opts.maxBodyBytes,
    maxFileBytes: opts.maxFileBytes,
    sandboxOf: (req) => resolved.get(req.raw) ?? null,
    runningSandboxes: () =>
      manager
        .list()
        .filter((s) => e2bState(s) === 'running')
        .map((s) => ({ id: s.id, accessTokens: tokens.accessTokens(s.id), tokenChecked: false })),
    requireRunning,
    cutOnStop: (id, socket) => stopWatch.watch(id, socket),
    onSandboxStopped: (listener) => manager.onSandboxStopped(listener),
  };
}
