/**
 * Rich outputs in the console's REPL, in a real browser against a real hostd serving the
 * python template (matplotlib and pandas): a chart is an image, a DataFrame a table, and other
 * HTML renders in a frame where its scripts do not run. Its own file: python's preloads take
 * minutes to boot on a busy host, which the other browser tests need not wait for.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { screenshot } from '../../testkit/browser.js';
import { scenario, useConsole } from './harness.js';

const harness = useConsole('python', 600_000);

test('charts render inline as images, DataFrames as tables, other HTML without scripts', async () => {
  await scenario(
    harness,
    'display',
    async (page, scope) => {
      const id = await scope.create({ template: 'python' });
      await page.goto(`${harness.hostd.url}/console/#/sandbox/${id}`);
      const code = page.getByRole('textbox', { name: 'Code' });
      await code.fill(
        'import matplotlib.pyplot as plt, pandas as pd\n' +
          'plt.plot([0.42, 0.61, 0.58, 0.83, 0.91]); plt.title("best reward per round"); plt.show()\n' +
          'pd.DataFrame({"child": ["a", "b", "c"], "reward": [0.81, 0.93, 0.77]})',
      );
      await code.press('Shift+Enter');
      const cell = page.locator('.cell').last();
      await cell.getByText('✔ exit 0').waitFor({ timeout: 300_000 });

      const chart = cell.getByRole('img', { name: /Figure/ });
      await chart.waitFor();
      assert.ok(
        await chart.evaluate((img) => (img as HTMLImageElement).naturalWidth > 100),
        'the chart decoded',
      );
      const table = cell.getByRole('table');
      assert.deepEqual(await table.getByRole('columnheader').allInnerTexts(), [
        '',
        'child',
        'reward',
      ]);
      assert.deepEqual(await table.getByRole('rowheader').allInnerTexts(), ['0', '1', '2']);
      assert.deepEqual(await table.getByRole('cell').allInnerTexts(), [
        'a',
        '0.81',
        'b',
        '0.93',
        'c',
        '0.77',
      ]);
      // The README's picture (docs/images/console.png is a copy of it): this cell on screen.
      await page.locator('h1').focus();
      await cell.evaluate((e) => e.scrollIntoView());
      await screenshot(page, 'console', false);

      // HTML that is not a table shows in a frame where its script does not run.
      await code.fill(
        'class Page:\n' +
          '    def _repr_html_(self):\n' +
          '        return "<b>rich</b><script>parent.document.title = \'pwned\'</script>"\n' +
          'Page()',
      );
      await code.press('Shift+Enter');
      const second = page.locator('.cell').last();
      await second.getByText('✔ exit 0').waitFor({ timeout: 120_000 });
      const frame = second.locator('iframe');
      assert.equal(await frame.getAttribute('sandbox'), '');
      assert.equal(
        await frame.contentFrame().locator('b').innerText(),
        'rich',
        'the HTML is shown in its frame',
      );
      assert.notEqual(await page.title(), 'pwned', 'its script did not run');
      await screenshot(page, 'repl-display');
    },
    { expectedErrors: /Blocked script execution in 'about:srcdoc'/ },
  );
});
