/**
 * A real browser for the web console's tests: Debian's chromium (scripts/host-packages; `npm
 * test` installs it) driven by playwright-core, which never downloads a browser of its own.
 * Screenshots go to artifacts/console/ (gitignored), which CI keeps as the run's artifacts.
 */
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { ROOT } from './root.js';

/** Where the tests write their screenshots. */
export const ARTIFACTS = join(ROOT, 'artifacts', 'console');

/** SERVICE_CHROMIUM overrides the browser, for hosts that keep it elsewhere. */
export const CHROMIUM = process.env.SERVICE_CHROMIUM ?? '/usr/bin/chromium';

/**
 * Flags for a browser that runs as root in a container and must reach nothing but the hostd
 * under test: no sandbox (root), no GPU, no background traffic, updates or sync. playwright
 * gives it a fresh profile directory of its own and removes it on close.
 */
const FLAGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

export async function launchBrowser(): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `${CHROMIUM} is missing: install Debian's chromium (npm test installs it; see scripts/host-packages)`,
    );
  }
  await mkdir(ARTIFACTS, { recursive: true });
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS });
}

/** Saves a screenshot of the whole page as artifacts/console/NAME.png; returns its path. */
export async function screenshot(page: Page, name: string, fullPage = true): Promise<string> {
  const path = join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path, fullPage });
  return path;
}

/**
 * Collects what the page reports as wrong: uncaught errors, console errors (a CSP violation is
 * one). Tests assert it stays empty.
 */
export function watchErrors(page: Page): string[] {
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    // An API error answer (a 401 before the key, a 404 for a deleted sandbox) is logged by the
    // browser too; the console handles those. Anything else is a fault.
    if (msg.type() === 'error' && !msg.text().startsWith('Failed to load resource')) {
      errors.push(`console error: ${msg.text()}`);
    }
  });
  return errors;
}
