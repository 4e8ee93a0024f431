/**
 * The guest console log that hostd keeps for each VM (docs/operations.md: `vms/<vm>/console.log`,
 * capped at 1 MiB): a guest that floods its console never makes it larger, whatever the pace,
 * and the last lines stay readable (GET /v1/sandboxes/{id}/logs shows them).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { withSandbox } from '../../testkit/sandboxes.js';

const MiB = 1024 * 1024;

let hostd: Hostd;
before(async () => {
  hostd = await startHostd({
    env: { SERVICE_TEMPLATES: 'python-slim', SERVICE_POOL_SIZE: '1' },
    startTimeoutMs: 600_000, // its template boots before hostd serves: minutes on a busy host
  });
});
after(async () => {
  await hostd.stop();
});

/** The console log of sandbox `id`'s VM: its record names the VM, whose folder holds it. */
async function consoleLogOf(id: string): Promise<string> {
  const record = JSON.parse(
    await readFile(join(hostd.dataDir, 'sandboxes', `${id}.json`), 'utf8'),
  ) as { vm: string };
  return join(hostd.stateDir, 'vms', record.vm, 'console.log');
}

test('a guest flooding its console never makes console.log larger than 1 MiB; its last lines are kept', async () => {
  await withSandbox(hostd, async (id) => {
    const log = await consoleLogOf(id);
    const marker = `flood-over-${randomBytes(6).toString('hex')}`;
    // Sampled while the guest writes, as peakRssGrowth samples memory: no step waits on it.
    let largest = 0;
    const sample = (): Promise<void> =>
      stat(log).then(
        (s) => void (largest = Math.max(largest, s.size)),
        () => undefined,
      );
    const sampler = setInterval(() => void sample(), 20);
    try {
      const flood = await run(
        hostd,
        id,
        `yes ${'x'.repeat(70)} | head -c ${3 * MiB} > /dev/console; echo ${marker} > /dev/console`,
        { language: 'bash' },
      );
      assert.equal(flood.exit, 0, flood.stderr);
      await eventually(
        'the last line of the flood in the sandbox log',
        async () =>
          (await (await hostd.request('GET', `/v1/sandboxes/${id}/logs`)).text()).includes(marker),
        { timeoutMs: 120_000 },
      );
    } finally {
      clearInterval(sampler);
    }
    await sample();
    assert.ok(largest > 0, 'the log was sampled');
    assert.ok(largest <= MiB, `console.log reached ${largest} bytes`);
  });
});
