/**
 * The E2B front's two credentials (docs/e2b.md, Auth).
 *
 * - The control plane takes the API key in `X-API-KEY`, matched against SERVICE_API_KEYS exactly
 *   as the native bearer is (api/auth.ts). With auth off any key works, and so does none: the
 *   SDKs insist on having one, so users set something.
 * - Sandbox traffic (envd, the code interpreter) never carries the API key: it carries the
 *   sandbox's own access token, `envdAccessToken` from the create answer, as `X-Access-Token`.
 *   Tokens are HMACs of the sandbox id under a secret kept in the data directory, so they
 *   survive restarts without being stored, and one sandbox's token opens no other.
 * - In cluster mode new tokens are issued under the cluster's shared secret (kept in etcd:
 *   core/cluster/shared-secret.ts) once the node has it, so a token opens its sandbox on
 *   whichever node the sandbox is moved to. The node's own secret is still accepted: tokens it
 *   issued before it joined a cluster (or before this was so) keep working on it.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { fail, type HostdError } from '../../errors.js';
import { makeKeyMatcher, type AuthMode } from '../auth.js';

/** Returns a checker of `X-API-KEY`: null when allowed, else the 401 error. */
export function makeApiKeyChecker(
  mode: AuthMode,
): (header: string | string[] | undefined) => HostdError | null {
  if (mode.kind === 'open') return () => null;
  const matches = makeKeyMatcher(mode);
  return (header) => {
    const key = Array.isArray(header) ? header[0] : header;
    if (key === undefined || key.trim() === '') return fail('missingE2bApiKey');
    return matches(key.trim()) ? null : fail('invalidApiKey');
  };
}

const SECRET_BYTES = 32;

/** The name of the cluster's shared secret E2B tokens are issued under (core/cluster/shared-secret.ts). */
export const E2B_TOKEN_SECRET = 'e2b-token';

/** Per-sandbox tokens derived from the node's secret, or the cluster's once it is shared. */
export class SandboxTokens {
  /** The cluster's shared secret: what tokens are issued under once set. */
  private shared: Buffer | null = null;

  private constructor(private readonly own: Buffer) {}

  /** Tokens under a fresh secret (unit tests; a hostd whose tokens need not outlive it). */
  static ephemeral(): SandboxTokens {
    return new SandboxTokens(randomBytes(SECRET_BYTES));
  }

  /**
   * Tokens under the secret in `file`, made (mode 0600, written atomically) when missing: a
   * restarted hostd gives every sandbox the token its clients already hold.
   */
  static async load(file: string): Promise<SandboxTokens> {
    const existing = await readFile(file).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    if (existing && existing.length >= SECRET_BYTES) return new SandboxTokens(existing);
    const secret = randomBytes(SECRET_BYTES);
    await writeSecret(file, secret);
    return new SandboxTokens(secret);
  }

  /**
   * A cluster node's tokens (docs/e2b.md, Auth): under its own secret (`dir`/e2b-token-secret),
   * and the cluster's shared one from etcd, which new tokens are issued under so that they open
   * their sandbox on any node it moves to. A node that has never had the cluster's (its first
   * start in cluster mode) waits for it as long as the join's first try (`waitMs`), then issues
   * under its own until etcd answers; one that kept a copy (`dir`/e2b-cluster-token-secret)
   * starts with that at once and takes etcd's when it comes.
   */
  static async ofClusterNode(
    dir: string,
    cluster: { sharedSecret(name: string): Promise<Buffer | null> },
    log: Logger,
    waitMs = 10_000,
  ): Promise<SandboxTokens> {
    const tokens = await SandboxTokens.load(join(dir, 'e2b-token-secret'));
    const copy = join(dir, 'e2b-cluster-token-secret');
    const kept = await tokens.loadShared(copy);
    const fetched = cluster
      .sharedSecret(E2B_TOKEN_SECRET)
      .then((secret) => (secret ? tokens.share(secret, copy) : undefined))
      .catch((err: unknown) =>
        log.warn({ err: (err as Error).message }, "the cluster's E2B token secret was not kept"),
      );
    if (!kept) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([fetched, new Promise((r) => (timer = setTimeout(r, waitMs)))]);
      clearTimeout(timer);
    }
    return tokens;
  }

  /**
   * Cluster mode: shares the cluster's secret as this node last had it, kept in `file` by
   * `share`, so that a node restarted while etcd is unreachable still issues and accepts the
   * tokens its sandboxes' clients hold. True when there was one.
   */
  private async loadShared(file: string): Promise<boolean> {
    const kept = await readFile(file).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    if (!kept || kept.length < SECRET_BYTES) return false;
    this.shared = kept;
    return true;
  }

  /**
   * Cluster mode, once the node has the cluster's secret: every token issued from now on is
   * derived from it; those of the node's own secret are still accepted. Never logged or shown;
   * kept in `file` (mode 0600) for `loadShared`. The cluster's wins over a kept one that differs
   * (etcd's copy was replaced): tokens of the old one are then refused, as after deleting it.
   */
  private async share(secret: Buffer, file: string): Promise<void> {
    if (this.shared?.equals(secret)) return;
    this.shared = secret;
    await writeSecret(file, secret);
  }

  /** `envdAccessToken`: what envd traffic and `/execute` carry as `X-Access-Token`. */
  accessToken(sandboxId: string): string {
    return derive(this.shared ?? this.own, 'access', sandboxId);
  }

  /** `trafficAccessToken`: what the code interpreter's calls carry as `E2B-Traffic-Access-Token`. */
  trafficToken(sandboxId: string): string {
    return derive(this.shared ?? this.own, 'traffic', sandboxId);
  }

  /**
   * Every access token this node accepts for the sandbox, the one it issues first: what a signed
   * `/files` URL may have been signed with.
   */
  accessTokens(sandboxId: string): string[] {
    return this.secrets().map((secret) => derive(secret, 'access', sandboxId));
  }

  /** True when `presented` is one of the sandbox's access tokens (constant time). */
  isAccessToken(sandboxId: string, presented: string | undefined): boolean {
    return matches(this.secrets(), ['access'], sandboxId, presented);
  }

  /** True when `presented` is one of the sandbox's traffic or access tokens (constant time). */
  isTrafficToken(sandboxId: string, presented: string | undefined): boolean {
    return matches(this.secrets(), ['traffic', 'access'], sandboxId, presented);
  }

  /**
   * True when `presented` is one of the sandbox's tokens under the cluster's shared secret
   * (`purposes`: access, traffic): one every node accepts, so its traffic may follow the
   * sandbox to another node (cluster-hop.ts, a move for room). False without a shared secret.
   */
  isClusterToken(
    sandboxId: string,
    presented: string | undefined,
    purposes: readonly ('access' | 'traffic')[],
  ): boolean {
    return this.shared !== null && matches([this.shared], purposes, sandboxId, presented);
  }

  /** The secrets tokens are checked against: the one issued under first. */
  private secrets(): Buffer[] {
    return this.shared ? [this.shared, this.own] : [this.own];
  }
}

/** Writes `secret` to `file` (mode 0600) atomically. */
async function writeSecret(file: string, secret: Buffer): Promise<void> {
  await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  await writeFile(`${file}.tmp`, secret, { mode: 0o600 });
  await rename(`${file}.tmp`, file);
}

function derive(secret: Buffer, purpose: string, sandboxId: string): string {
  return createHmac('sha256', secret).update(`e2b-${purpose}:${sandboxId}`).digest('hex');
}

/** Constant-time equality that does not reveal where, or whether lengths, differ. */
function same(expected: string, presented: string): boolean {
  const a = createHmac('sha256', 'cmp').update(expected).digest();
  const b = createHmac('sha256', 'cmp').update(presented).digest();
  return timingSafeEqual(a, b);
}

/**
 * True when `presented` is the token of `sandboxId` for one of `purposes` under one of
 * `secrets`; every pair is compared (constant time, whichever matches).
 */
function matches(
  secrets: readonly Buffer[],
  purposes: readonly string[],
  sandboxId: string,
  presented: string | undefined,
): boolean {
  if (presented === undefined) return false;
  let ok = false;
  for (const secret of secrets) {
    for (const purpose of purposes) ok = same(derive(secret, purpose, sandboxId), presented) || ok;
  }
  return ok;
}
