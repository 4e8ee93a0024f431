/**
 * Integration tests run against the real hostd named by SERVICE_HOSTD_URL (with
 * SERVICE_API_KEY if it requires one), which sdk/test.sh's caller starts. Without it they are
 * skipped with this message; unit tests still run.
 */
import { fileURLToPath } from 'node:url';
import { resolve } from 'node:path';

export const LIVE_URL = process.env.SERVICE_HOSTD_URL?.trim() || undefined;

/** `skip` option for node:test: false when a real hostd is configured, else the reason. */
export const skipLive: string | false = LIVE_URL
  ? false
  : 'SERVICE_HOSTD_URL is not set: integration tests against a real hostd are skipped';

/** sdk/typescript, whatever the working directory. */
export const PACKAGE_DIR = resolve(fileURLToPath(import.meta.url), '..', '..', '..', '..');
export const REPO_ROOT = resolve(PACKAGE_DIR, '..', '..');
export const CLI = resolve(PACKAGE_DIR, 'dist', 'src', 'cli.js');

/** Generous per-test bound: VMs under TCG are slow, but nothing may hang forever. */
export const LIVE_TIMEOUT_MS = 120_000;
