/**
 * hostd's own life: a clean SIGTERM leaves nothing behind; a crash (SIGKILL) takes its VMs with
 * it, and the next start on the same state directory removes whatever was left.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readdir, writeFile } from 'node:fs/promises';
import { nothingLeft, startHostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox } from '../../testkit/sandboxes.js';
import { findProcessesUsing } from '../../src/state-dir.js';
import { eventually } from '../../testkit/eventually.js';

test('SIGTERM destroys every VM and removes the state directory', async () => {
  const hostd = await startHostd();
  const id = await createSandbox(hostd);
  assert.equal((await run(hostd, id, 'print(1)')).stdout, '1\n');
  assert.ok((await findProcessesUsing(hostd.stateDir)).length >= 1);
  assert.equal(await hostd.stop('SIGTERM'), 0);
  assert.deepEqual(await nothingLeft(hostd.stateDir), { qemu: 0, dirExists: false });
});

test('after SIGKILL no QEMU survives, and a restart cleans the state directory', async () => {
  const first = await startHostd();
  await createSandbox(first);
  assert.ok((await findProcessesUsing(first.stateDir)).length >= 1);
  await first.stop('SIGKILL');
  // The kernel delivers the parent-death signal to every QEMU.
  await eventually(
    'every QEMU to die with hostd',
    async () => (await findProcessesUsing(first.stateDir)).length === 0,
  );
  assert.ok(existsSync(first.stateDir), 'the crashed run left its directory');
  await writeFile(`${first.stateDir}/leftover.mem`, 'x');

  const second = await startHostd({ stateDir: first.stateDir });
  try {
    const entries = await readdir(second.stateDir);
    assert.ok(!entries.includes('leftover.mem'));
    const id = await createSandbox(second);
    assert.equal((await run(second, id, 'print(2)')).stdout, '2\n');
  } finally {
    await second.stop();
  }
  assert.deepEqual(await nothingLeft(first.stateDir), { qemu: 0, dirExists: false });
});

test('a second hostd refuses a state directory that a live hostd holds', async () => {
  const first = await startHostd({ env: { SERVICE_POOL_SIZE: '0' } });
  try {
    const second = await startHostd({ stateDir: first.stateDir, expectExit: true });
    const code = await second.stop();
    assert.notEqual(code, 0, 'the second hostd refused to start');
    assert.equal((await first.request('GET', '/v1/healthz')).status, 200);
  } finally {
    await first.stop();
  }
});
