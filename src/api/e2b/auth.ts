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
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
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

/** Per-sandbox tokens derived from one secret. */
export class SandboxTokens {
  private constructor(private readonly secret: Buffer) {}

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
    await mkdir(dirname(file), { recursive: true, mode: 0o700 });
    await writeFile(`${file}.tmp`, secret, { mode: 0o600 });
    await rename(`${file}.tmp`, file);
    return new SandboxTokens(secret);
  }

  /** `envdAccessToken`: what envd traffic and `/execute` carry as `X-Access-Token`. */
  accessToken(sandboxId: string): string {
    return this.derive('access', sandboxId);
  }

  /** `trafficAccessToken`: what the code interpreter's calls carry as `E2B-Traffic-Access-Token`. */
  trafficToken(sandboxId: string): string {
    return this.derive('traffic', sandboxId);
  }

  /** True when `presented` is the sandbox's access token (constant time). */
  isAccessToken(sandboxId: string, presented: string | undefined): boolean {
    return presented !== undefined && same(this.accessToken(sandboxId), presented);
  }

  /** True when `presented` is the sandbox's traffic token or its access token (constant time). */
  isTrafficToken(sandboxId: string, presented: string | undefined): boolean {
    if (presented === undefined) return false;
    const traffic = same(this.trafficToken(sandboxId), presented);
    const access = same(this.accessToken(sandboxId), presented);
    return traffic || access;
  }

  private derive(purpose: string, sandboxId: string): string {
    return createHmac('sha256', this.secret).update(`e2b-${purpose}:${sandboxId}`).digest('hex');
  }
}

/** Constant-time equality that does not reveal where, or whether lengths, differ. */
function same(expected: string, presented: string): boolean {
  const a = createHmac('sha256', 'cmp').update(expected).digest();
  const b = createHmac('sha256', 'cmp').update(presented).digest();
  return timingSafeEqual(a, b);
}
