/**
 * What the console's browser tests share: a hostd with a key (so the key prompt is exercised)
 * and Debian's chromium, one of each per test file, and scenarios that report the sandboxes
 * they leave (id and VM log tail) when they fail and delete them either way.
 */
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { launchBrowser, screenshot, watchErrors } from '../../testkit/browser.js';
import { nothingLeft, startHostd, type Hostd } from '../../testkit/hostd.js';
import { withSandboxes, type SandboxInfo, type SandboxScope } from '../../testkit/sandboxes.js';

export const KEY = `console-test-${process.pid}`;
export const PHONE = { width: 390, height: 844 };
export const DESKTOP = { width: 1280, height: 800 };

/** The hostd and browser of a test file, set once its `before` hook has run. */
export interface Harness {
  hostd: Hostd;
  browser: Browser;
}

/**
 * Starts a hostd serving `templates` and a browser before the file's tests, stops both after
 * them, and checks that no QEMU is left.
 */
export function useConsole(templates: string, startTimeoutMs = 300_000): Harness {
  const harness = {} as Harness;
  before(async () => {
    [harness.hostd, harness.browser] = await Promise.all([
      startHostd({
        apiKey: KEY,
        env: { SERVICE_API_KEYS: KEY, SERVICE_TEMPLATES: templates, SERVICE_POOL_SIZE: '1' },
        startTimeoutMs,
      }),
      launchBrowser(),
    ]);
  });
  after(async () => {
    await harness.browser?.close();
    const { hostd } = harness;
    await hostd?.stop();
    if (hostd) assert.deepEqual(await nothingLeft(hostd.stateDir), { qemu: 0, dirExists: false });
  });
  return harness;
}

/** A page whose session already holds the key, as after the first prompt. */
export async function openConsole(
  { hostd, browser }: Harness,
  hash = '#/sandboxes',
  viewport = DESKTOP,
  contextOptions: Parameters<Browser['newContext']>[0] = {},
): Promise<{ page: Page; context: BrowserContext; errors: string[] }> {
  const context = await browser.newContext({ viewport, ...contextOptions });
  // Only in the top page: a frame sandboxed without same-origin may not touch storage.
  await context.addInitScript((key) => {
    if (window === window.top) sessionStorage.setItem('hostd.key', key);
  }, KEY);
  const page = await context.newPage();
  const errors = watchErrors(page);
  await page.goto(`${hostd.url}/console/${hash}`);
  return { page, context, errors };
}

/**
 * Runs a scenario on a fresh page; every sandbox alive at its end is reported (id and VM log
 * tail) if it failed, and deleted either way. A failure also leaves a screenshot of the page.
 * The page must report no error (a CSP violation is one), but for `expectedErrors`.
 */
export async function scenario(
  harness: Harness,
  name: string,
  fn: (page: Page, scope: SandboxScope) => Promise<void>,
  opts: { hash?: string; viewport?: typeof DESKTOP; expectedErrors?: RegExp } = {},
): Promise<void> {
  const { page, context, errors } = await openConsole(harness, opts.hash, opts.viewport);
  const unexpected = (): string[] => errors.filter((e) => !opts.expectedErrors?.test(e));
  try {
    await withSandboxes(harness.hostd, async (scope) => {
      try {
        await fn(page, scope);
        assert.deepEqual(unexpected(), [], 'the page reported no error');
      } catch (err) {
        await screenshot(page, `failed-${name}`).catch(() => undefined);
        throw err;
      } finally {
        scope.track(await aliveIds(harness.hostd));
      }
    });
  } finally {
    await context.close();
  }
}

export async function aliveIds(hostd: Hostd): Promise<string[]> {
  const res = await hostd.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes');
  return res.body.sandboxes.map((s) => s.id);
}

/** The row of sandbox `id` in the sandboxes table. */
export const rowOf = (page: Page, id: string) =>
  page.getByRole('row').filter({ has: page.getByRole('link', { name: id.slice(0, 12) }) });
