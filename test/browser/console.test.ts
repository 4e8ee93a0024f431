/**
 * The web console in a real browser (Debian's chromium through playwright-core) against a real
 * hostd: what a person sees and can do, by keyboard too, at 1280 px and at phone width, with
 * states readable without colour and no accessibility violation axe-core can find. Screenshots
 * of the main views go to artifacts/console/. python-slim serves every sandbox here; the
 * rendering of charts and DataFrames, which needs the python template, is display.test.ts.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { screenshot, watchErrors } from '../../testkit/browser.js';
import { run } from '../../testkit/exec.js';
import { sandboxInfo, withSandboxes } from '../../testkit/sandboxes.js';
import {
  aliveIds,
  DESKTOP,
  KEY,
  openConsole,
  PHONE,
  rowOf,
  scenario as harnessScenario,
  useConsole,
} from './harness.js';

const harness = useConsole('python-slim');
/** A scenario on this file's hostd and browser. */
const scenario = (
  name: string,
  fn: Parameters<typeof harnessScenario>[2],
  opts?: Parameters<typeof harnessScenario>[3],
): Promise<void> => harnessScenario(harness, name, fn, opts);

describe('the console', () => {
  test('/ opens the console, asks for the key once, and lists sandboxes live', async () => {
    const context = await harness.browser.newContext({ viewport: DESKTOP });
    const page = await context.newPage();
    const errors = watchErrors(page);
    try {
      await withSandboxes(harness.hostd, async (scope) => {
        await page.goto(`${harness.hostd.url}/`);
        assert.equal(new URL(page.url()).pathname, '/console/');
        const dialog = page.getByRole('dialog', { name: 'API key' });
        await dialog.waitFor();
        await dialog.getByLabel('API key').fill(KEY);
        await dialog.getByLabel('API key').press('Enter');
        await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();

        // Live: a sandbox made elsewhere shows up without a reload, with its facts.
        const id = await scope.create({ template: 'python-slim' });
        const row = rowOf(page, id);
        await row.waitFor({ timeout: 30_000 });
        const text = await row.innerText();
        assert.match(text, /ready/);
        assert.match(text, /python-slim/);
        assert.match(text, /\d+\.\d MiB/, 'its own memory');

        // The key is kept for the session: a reload asks nothing.
        await page.reload();
        await row.waitFor({ timeout: 30_000 });
        assert.equal(await page.getByRole('dialog').count(), 0);
        assert.equal(await page.evaluate(() => sessionStorage.getItem('hostd.key')), KEY);
        await screenshot(page, 'sandboxes');
        assert.deepEqual(errors, []);
      });
    } finally {
      await context.close();
    }
  });

  test('create from the dialog with Enter, then run code whose output streams in', async () => {
    await scenario('create-and-exec', async (page) => {
      await page.getByRole('button', { name: 'New sandbox' }).click();
      const dialog = page.getByRole('dialog', { name: 'New sandbox' });
      await dialog.getByLabel('Template').selectOption('python-slim');
      await dialog.getByLabel('Outbound network (optional)').press('Enter');
      await page
        .getByRole('status')
        .filter({ hasText: /Created sbx_/ })
        .waitFor();
      const id = /sbx_[0-9a-f]{32}/.exec(await page.getByRole('status').innerText())![0];

      await page.getByRole('link', { name: id.slice(0, 12) }).click();
      await page.getByRole('heading', { name: `Sandbox ${id}` }).waitFor();
      // The cell prints, then waits for a file the test writes only once it saw the line:
      // the line must have reached the page while the code still ran.
      const code = page.getByRole('textbox', { name: 'Code' });
      await code.fill(
        'import os, sys, time\nprint("first")\nprint("warning", file=sys.stderr)\n' +
          'while not os.path.exists("/tmp/go"): time.sleep(0.05)\nprint("second")',
      );
      await code.press('Shift+Enter');
      const cell = page.locator('.cell').last();
      await cell.locator('pre.stdout', { hasText: 'first' }).waitFor({ timeout: 60_000 });
      await cell.locator('pre.stderr', { hasText: 'warning' }).waitFor({ timeout: 60_000 });
      assert.equal(await cell.locator('.exit').innerText(), 'running…');
      assert.match(
        await cell.locator('.cell-out').innerText(),
        /stderr\s+warning/,
        'stderr is labelled in words',
      );
      const go = await harness.hostd.request('PUT', `/v1/sandboxes/${id}/files?path=/tmp/go`, 'x', {
        'content-type': 'application/octet-stream',
      });
      assert.equal(go.status, 200);
      await cell.getByText('✔ exit 0').waitFor({ timeout: 60_000 });
      assert.match(await cell.innerText(), /first\s+.*second/s);

      // State persists between cells; a failure says so in words.
      await code.fill('1/0');
      await page.getByRole('button', { name: 'Run' }).click();
      await page.locator('.cell').last().getByText('✖ exit 1').waitFor({ timeout: 60_000 });
      assert.match(await page.locator('.cell').last().innerText(), /ZeroDivisionError/);
      await code.fill('echo from bash');
      await page.getByLabel('Language').selectOption('bash');
      await code.press('Control+Enter');
      await page.locator('.cell').last().getByText('✔ exit 0').waitFor({ timeout: 60_000 });
      assert.match(await page.locator('.cell').last().innerText(), /from bash/);
      await screenshot(page, 'sandbox');
    });
  });

  test('fork shows in the lineage tree; a merge asks first and is drawn after', async () => {
    await scenario('lineage', async (page, scope) => {
      const parent = await scope.create({ template: 'python-slim' });
      await run(harness.hostd, parent, 'who = "parent"');
      await page.goto(`${harness.hostd.url}/console/#/sandbox/${parent}`);
      await page.getByRole('button', { name: `Fork ${parent}` }).click();
      const dialog = page.getByRole('dialog', { name: /^Fork / });
      await dialog.getByLabel('Children').fill('2');
      await dialog.getByLabel('Children').press('Enter');
      await page.getByRole('status').filter({ hasText: 'into 2' }).waitFor({ timeout: 120_000 });
      const children = (await aliveIds(harness.hostd)).filter((id) => id !== parent);
      scope.track(children);
      assert.equal(children.length, 2);
      const [winner, sibling] = children as [string, string];
      await run(harness.hostd, winner, 'who = "winner"');

      await page.getByRole('link', { name: 'Lineage', exact: true }).click();
      const tree = page.getByRole('list', { name: 'Sandbox lineage' });
      const parentItem = tree.getByRole('listitem').filter({
        has: page.getByRole('link', { name: parent.slice(0, 12) }),
      });
      await parentItem.first().waitFor();
      for (const child of children) {
        await parentItem.getByRole('link', { name: child.slice(0, 12) }).waitFor();
      }

      // Escape dismisses the confirmation: nothing is merged.
      const merge = page.getByRole('button', { name: `Merge into parent ${winner}` });
      await merge.click();
      const confirm = page.getByRole('dialog', { name: 'Merge into parent?' });
      await confirm.waitFor();
      await page.keyboard.press('Escape');
      await confirm.waitFor({ state: 'detached' });
      assert.equal((await sandboxInfo(harness.hostd, winner)).state, 'ready');

      await merge.click();
      await confirm.getByRole('button', { name: 'Merge' }).click();
      await page.getByRole('status').filter({ hasText: 'Merged' }).waitFor({ timeout: 60_000 });
      assert.equal((await run(harness.hostd, parent, 'print(who)')).stdout, 'winner\n');
      const merged = parentItem.first().getByText(/merged in/);
      await merged.waitFor({ timeout: 30_000 });
      assert.match(await parentItem.first().innerText(), new RegExp(winner.slice(0, 12)));
      await parentItem.getByRole('link', { name: sibling.slice(0, 12) }).waitFor();
      await screenshot(page, 'lineage');
    });
  });

  test('files: upload into a folder, browse, download, delete after confirming', async () => {
    await scenario('files', async (page, scope) => {
      const id = await scope.create({ template: 'python-slim' });
      await run(harness.hostd, id, 'mkdir -p /root/data/sub', { language: 'bash' });
      await page.goto(`${harness.hostd.url}/console/#/sandbox/${id}`);
      const files = page.getByRole('region', { name: 'Files in /root' });
      await files.getByRole('button', { name: 'data/' }).click();
      await page.getByRole('region', { name: 'Files in /root/data' }).waitFor();
      assert.equal(await page.getByLabel('Folder', { exact: true }).inputValue(), '/root/data');

      await page.getByLabel('Upload into this folder').setInputFiles({
        name: 'notes.txt',
        mimeType: 'text/plain',
        buffer: Buffer.from('hello from the browser\n'),
      });
      await page.getByRole('button', { name: 'Upload', exact: true }).click();
      const listing = page.getByRole('region', { name: 'Files in /root/data' });
      await listing.getByRole('rowheader', { name: 'notes.txt' }).waitFor();
      const r = await run(harness.hostd, id, 'cat /root/data/notes.txt', { language: 'bash' });
      assert.equal(r.stdout, 'hello from the browser\n');

      const [download] = await Promise.all([
        page.waitForEvent('download'),
        listing.getByRole('button', { name: 'Download notes.txt' }).click(),
      ]);
      assert.equal(download.suggestedFilename(), 'notes.txt');
      assert.equal(await readFile((await download.path())!, 'utf8'), 'hello from the browser\n');

      // Typing a path and pressing Enter opens it.
      await page.getByLabel('Folder', { exact: true }).fill('/root/data/sub');
      await page.getByLabel('Folder', { exact: true }).press('Enter');
      await page.getByText('/root/data/sub is empty.').waitFor();
      await page.getByLabel('Folder', { exact: true }).fill('/root/data');
      await page.getByLabel('Folder', { exact: true }).press('Enter');

      await listing.getByRole('button', { name: 'Delete notes.txt' }).click();
      await page
        .getByRole('dialog', { name: 'Delete file?' })
        .getByRole('button', { name: 'Delete' })
        .click();
      await listing.getByRole('rowheader', { name: 'notes.txt' }).waitFor({ state: 'detached' });
      const gone = await run(harness.hostd, id, 'test -e /root/data/notes.txt; echo $?', {
        language: 'bash',
      });
      assert.equal(gone.stdout, '1\n');
    });
  });

  test('pause, resume, snapshot and delete, with the network shown', async () => {
    await scenario('lifecycle', async (page, scope) => {
      const id = await scope.create({
        template: 'python-slim',
        network: { allow_out: ['pypi.org:443', '*.example.com'] },
      });
      await page.goto(`${harness.hostd.url}/console/#/sandbox/${id}`);
      const network = page.getByRole('region', { name: 'Network' });
      await network
        .getByRole('list', { name: 'Outbound rules' })
        .getByText('pypi.org:443')
        .waitFor();
      assert.match(await network.innerText(), /Sent\s+0 B/);

      await page.getByRole('button', { name: `Pause ${id}` }).click();
      await page.getByRole('button', { name: `Resume ${id}` }).waitFor({ timeout: 60_000 });
      assert.equal((await sandboxInfo(harness.hostd, id)).state, 'paused');
      assert.match(await page.locator('dl.facts').first().innerText(), /paused/);
      await page.getByRole('button', { name: `Resume ${id}` }).click();
      await page.getByRole('button', { name: `Pause ${id}` }).waitFor({ timeout: 60_000 });
      assert.equal((await sandboxInfo(harness.hostd, id)).state, 'ready');

      await page.getByRole('button', { name: `Snapshot ${id}` }).click();
      const status = page.getByRole('status').filter({ hasText: /Snapshot snap_/ });
      await status.waitFor({ timeout: 120_000 });
      const snap = /snap_[0-9a-f]+/.exec(await status.innerText())![0];

      await page.getByRole('link', { name: 'Snapshots', exact: true }).click();
      await page.getByRole('button', { name: `New sandbox from ${snap}` }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Create' }).click();
      await page.getByRole('heading', { name: /^Sandbox sbx_/ }).waitFor({ timeout: 60_000 });
      const copy = /sbx_[0-9a-f]{32}/.exec(page.url())![0];
      assert.equal((await sandboxInfo(harness.hostd, copy)).snapshot_id, snap);
      await page.locator('dl.facts').first().getByText(snap).waitFor();

      await page.getByRole('link', { name: 'Snapshots', exact: true }).click();
      await screenshot(page, 'snapshots');
      await page.getByRole('button', { name: `Delete ${snap}` }).click();
      await page
        .getByRole('dialog', { name: 'Delete snapshot?' })
        .getByRole('button', { name: 'Delete' })
        .click();
      await page.getByText('No snapshots yet.').waitFor();

      await page.goto(`${harness.hostd.url}/console/#/sandbox/${id}`);
      await page.getByRole('button', { name: `Delete ${id}` }).click();
      await page
        .getByRole('dialog', { name: 'Delete sandbox?' })
        .getByRole('button', { name: 'Delete' })
        .click();
      await page.getByText('This sandbox no longer exists').waitFor({ timeout: 30_000 });
      const res = await harness.hostd.request('GET', `/v1/sandboxes/${id}`);
      assert.equal(res.status, 404);
    });
  });

  test('templates show their state and build log; host figures come from /metrics', async () => {
    await scenario(
      'templates-host',
      async (page) => {
        const table = page.getByRole('table', { name: 'Templates' });
        for (const name of ['python-slim']) {
          await table
            .getByRole('row')
            .filter({ hasText: name })
            .getByText('ready')
            .first()
            .waitFor();
        }
        await page.getByRole('button', { name: 'Build log of python-slim' }).click();
        const log = page.getByRole('dialog', { name: 'Build log of python-slim' });
        await log.waitFor();
        await page.keyboard.press('Escape');
        await log.waitFor({ state: 'detached' });
        await screenshot(page, 'templates');

        await page.getByRole('link', { name: 'Host', exact: true }).click();
        const figures = page.locator('dl.figures');
        await figures.getByText('Sandboxes alive').waitFor();
        const text = await figures.innerText();
        assert.match(text, /Accelerator\s+(tcg|kvm)/);
        assert.match(text, /Warm pool: python-slim\s+\d+ ready/);
        await screenshot(page, 'host');
      },
      { hash: '#/templates' },
    );
  });

  test('keyboard: visible focus, dialogs keep focus inside, Escape closes and focus returns', async () => {
    await scenario('keyboard', async (page) => {
      await page.getByRole('heading', { name: 'Sandboxes' }).waitFor();
      // From the skip link, Tab goes through the navigation in reading order, then into the
      // view; the focused control always shows an outline.
      await page.locator('.skip').focus();
      const order: string[] = [];
      for (let i = 0; i < 8; i++) {
        await page.keyboard.press('Tab');
        order.push(await page.evaluate(() => document.activeElement?.textContent?.trim() ?? ''));
        const outline = await page.evaluate(() => {
          const s = getComputedStyle(document.activeElement!);
          return `${s.outlineStyle} ${s.outlineWidth}`;
        });
        assert.match(outline, /^solid [1-9]/, `focus is visible on "${order.at(-1)}"`);
      }
      assert.deepEqual(order, [
        'hostd',
        'Sandboxes',
        'Lineage',
        'Snapshots',
        'Templates',
        'Host',
        'Forget key',
        'New sandbox',
      ]);
      // The skip link leads to the view.
      await page.locator('.skip').focus();
      await page.keyboard.press('Enter');
      assert.equal(await page.evaluate(() => document.activeElement?.id), 'main');

      const open = page.getByRole('button', { name: 'New sandbox' });
      await open.focus();
      await page.keyboard.press('Enter');
      const dialog = page.getByRole('dialog', { name: 'New sandbox' });
      await dialog.waitFor();
      for (let i = 0; i < 8; i++) {
        await page.keyboard.press('Tab');
        assert.ok(
          await page.evaluate(() => !!document.activeElement?.closest('dialog')),
          'focus stays in the dialog',
        );
      }
      await page.keyboard.press('Escape');
      await dialog.waitFor({ state: 'detached' });
      assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'New sandbox');
    });
  });

  test('at phone width every view fits the screen, and states are words, not only colours', async () => {
    await scenario(
      'phone',
      async (page, scope) => {
        const id = await scope.create({ template: 'python-slim' });
        await page.goto(`${harness.hostd.url}/console/#/sandboxes`);
        await rowOf(page, id).waitFor();
        for (const [name, hash] of [
          ['sandboxes', '#/sandboxes'],
          ['lineage', '#/lineage'],
          ['sandbox', `#/sandbox/${id}`],
          ['snapshots', '#/snapshots'],
          ['templates', '#/templates'],
          ['host', '#/host'],
        ] as const) {
          await page.goto(`${harness.hostd.url}/console/${hash}`);
          await page.locator('main h1').waitFor();
          await page.locator('main .live > *').first().waitFor();
          const overflow = await page.evaluate(
            () => document.documentElement.scrollWidth - window.innerWidth,
          );
          assert.ok(overflow <= 0, `${name} is ${overflow} px wider than the screen`);
          await screenshot(page, `phone-${name}`);
        }
        await page.goto(`${harness.hostd.url}/console/#/sandboxes`);
        await rowOf(page, id).waitFor();
        for (const state of await page.locator('.state').allInnerTexts()) {
          assert.match(state, /^\S+ [a-z]/, `"${state}" has a symbol and a word`);
        }
      },
      { viewport: PHONE },
    );
  });

  test('axe-core finds no accessibility violation in any view or dialog', async () => {
    const axe = await readFile(
      createRequire(import.meta.url).resolve('axe-core/axe.min.js'),
      'utf8',
    );
    // Only to inject the checker: the console's own CSP would refuse its inline script.
    const { page, context } = await openConsole(harness, '#/sandboxes', DESKTOP, {
      bypassCSP: true,
    });
    try {
      await withSandboxes(harness.hostd, async (scope) => {
        const id = await scope.create({ template: 'python-slim' });
        const check = async (what: string): Promise<void> => {
          await page.addScriptTag({ content: axe });
          const violations = await page.evaluate(async () => {
            const w = window as unknown as {
              axe: { run(ctx: Document, opts: unknown): Promise<{ violations: Violation[] }> };
            };
            type Violation = { id: string; help: string; nodes: { target: string[] }[] };
            const result = await w.axe.run(document, {
              runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] },
            });
            return result.violations.map(
              (v) => `${v.id} (${v.help}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`,
            );
          });
          assert.deepEqual(violations, [], `${what}: accessibility violations`);
        };
        for (const hash of ['#/sandboxes', '#/lineage', '#/snapshots', '#/templates', '#/host']) {
          await page.goto(`${harness.hostd.url}/console/${hash}`);
          await page.locator('main .live > *').first().waitFor();
          await check(hash);
        }
        await page.goto(`${harness.hostd.url}/console/#/sandbox/${id}`);
        await page.locator('main .live > *').first().waitFor();
        await page.getByRole('textbox', { name: 'Code' }).fill('print("hi")');
        await page.getByRole('textbox', { name: 'Code' }).press('Shift+Enter');
        await page.locator('.cell').getByText('✔ exit 0').waitFor({ timeout: 60_000 });
        await check('a sandbox page with output');
        await page.getByRole('button', { name: `Delete ${id}` }).click();
        await page.getByRole('dialog').waitFor();
        await check('a confirmation dialog');
        await page.keyboard.press('Escape');
      });
    } finally {
      await context.close();
    }
  });
});
