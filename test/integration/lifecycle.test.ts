/**
 * hostd's own life: a clean SIGTERM leaves no process and no runtime file behind (sandboxes are
 * paused to disk: test/integration/persistence.test.ts); after a crash (SIGKILL) its VMs run on,
 * and the next start re-adopts them with their state and removes what else the crash left.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import {
  nothingLeft,
  sandboxQemuPid,
  startHostd,
  type ErrorBody,
  type Hostd,
} from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox } from '../../testkit/sandboxes.js';
import { findProcessesUsing } from '../../src/state-dir.js';

test('SIGTERM destroys every VM and removes the state directory', async () => {
  const hostd = await startHostd();
  const id = await createSandbox(hostd);
  assert.equal((await run(hostd, id, 'print(1)')).stdout, '1\n');
  assert.ok((await findProcessesUsing(hostd.stateDir)).length >= 1);
  assert.equal(await hostd.stop('SIGTERM'), 0);
  assert.deepEqual(await nothingLeft(hostd.stateDir), { qemu: 0, dirExists: false });
});

test("QEMU loads hostd's stand-in for libcapstone, not Debian's (1.3 MiB less per VM)", async () => {
  const hostd = await startHostd();
  try {
    const id = await createSandbox(hostd);
    const maps = await readFile(`/proc/${await sandboxQemuPid(hostd, id)}/maps`, 'utf8');
    const capstone = [...new Set(maps.match(/\/\S*libcapstone\S*/g))];
    assert.equal(capstone.length, 1, `one capstone library mapped: ${capstone.join(', ')}`);
    assert.ok(capstone[0]!.includes('/qemu-libs/'), `${capstone[0]} is the stand-in`);
  } finally {
    await hostd.stop();
  }
});

test('after SIGKILL the VMs run on; the next start re-adopts them with their state', async () => {
  // Both hostds share the data directory (records) and the state directory (VM sockets).
  const dataDir = await mkdtemp('/var/tmp/hostd-test-data-');
  const first = await startHostd({ env: { SERVICE_POOL_SIZE: '1' }, dataDir });
  const ids: string[] = [];
  let second: Hostd | undefined;
  try {
    for (let i = 0; i < 8; i++) {
      const id = await createSandbox(first);
      ids.push(id);
      const r = await run(first, id, `me = ${i}\nopen("/root/me.txt", "w").write(str(me * 10))`);
      assert.equal(r.exit, 0, r.stderr);
    }
    // One exec is running when hostd dies: its client's connection drops.
    const running = first.request('POST', `/v1/sandboxes/${ids[0]}/exec`, {
      code: 'import time\nprint("busy", flush=True)\ntime.sleep(3600)',
    });
    const res = await running;
    await res.body!.getReader().read(); // it runs: its first line has arrived
    const lostVm = await sandboxQemuPid(first, ids[7]!);
    await first.stop('SIGKILL');
    const qemus = (await findProcessesUsing(first.stateDir)).length;
    assert.ok(qemus >= ids.length, `the VMs outlived hostd (${qemus} QEMUs)`);
    process.kill(lostVm, 'SIGKILL'); // one dies while no hostd runs

    second = await startHostd({ stateDir: first.stateDir, dataDir });
    for (const [i, id] of ids.slice(0, 7).entries()) {
      const r = await run(second, id, 'print(me, open("/root/me.txt").read())');
      assert.equal(r.stdout, `${i} ${i * 10}\n`, `sandbox ${id}: ${r.stderr}`);
    }
    const lost = await second.json<ErrorBody>('GET', `/v1/sandboxes/${ids[7]}`);
    assert.equal(lost.status, 410);
    assert.equal(lost.body.code, 'sandbox_lost');
    assert.equal((await second.request('DELETE', `/v1/sandboxes/${ids[7]}`)).status, 204);
    assert.equal((await second.request('GET', `/v1/sandboxes/${ids[7]}`)).status, 404);
    // The crashed run's pooled VM was stopped, not adopted: only sandboxes' VMs and the new
    // hostd's own pool run.
    const listed = await second.json<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes');
    assert.equal(listed.body.sandboxes.length, 7);
  } finally {
    await second?.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
  assert.deepEqual(await nothingLeft(first.stateDir), { qemu: 0, dirExists: false });
});

test('a second hostd refuses the directories a live hostd holds, and leaves them as they were', async () => {
  const first = await startHostd({
    env: { SERVICE_POOL_SIZE: '1', SERVICE_TEMPLATES: 'python-slim' },
    dataDir: await mkdtemp('/var/tmp/hostd-test-data-'),
  });
  try {
    const modes = async (): Promise<number[]> =>
      Promise.all([first.stateDir, first.dataDir].map(async (d) => (await stat(d)).mode));
    const before = await modes();
    // The same two directories, then only the data directory (with a state directory of its own).
    for (const stateDir of [first.stateDir, await mkdtemp('/dev/shm/hostd-test-')]) {
      const second = await startHostd({ stateDir, dataDir: first.dataDir, expectExit: true });
      assert.equal(await second.stop(), 1, 'the second hostd refused to start');
      if (stateDir !== first.stateDir) await rm(stateDir, { recursive: true, force: true });
    }
    assert.deepEqual(await modes(), before, 'the refused starts changed no permission');
    // QEMU (hostd-vm when hostd runs as root) still reaches the first hostd's directories.
    const id = await createSandbox(first);
    assert.equal((await run(first, id, 'print(6 * 7)')).stdout, '42\n');
  } finally {
    await first.stop();
    await rm(first.dataDir, { recursive: true, force: true });
  }
});
