/**
 * Authentication as docs/api.md specifies it, where it takes a real hostd: keys kept from the
 * VMs and the logs, and the start-up rules of main.ts. What the HTTP layer answers (401s, which
 * routes are guarded, percent-encoded paths) is test/unit/routes-service.test.ts's and
 * routes-contract.test.ts's, through inject().
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { findProcessesUsing } from '../../src/state-dir.js';
import { eventually } from '../../testkit/eventually.js';
import { startHostd, type Hostd } from '../../testkit/hostd.js';
import { ROOT } from '../../testkit/root.js';

describe('with SERVICE_API_KEYS set', () => {
  let hostd: Hostd;
  before(async () => {
    hostd = await startHostd({
      env: { SERVICE_API_KEYS: 'key-one,key-two', SERVICE_POOL_SIZE: '1' },
    });
  });
  after(async () => {
    await hostd.stop();
  });

  test("the keys are not in the VMs' QEMU processes, which run untrusted guests", async () => {
    let pids: number[] = [];
    await eventually(
      'a pool VM',
      async () => (pids = await findProcessesUsing(hostd.stateDir)).length > 0,
    );
    for (const pid of pids) {
      const environ = await readFile(`/proc/${pid}/environ`, 'utf8');
      assert.ok(!environ.includes('key-one'), `QEMU ${pid} has the API keys in its environment`);
    }
  });

  test('keys never appear in the logs', () => {
    assert.ok(!hostd.logs.some((l) => l.includes('key-one') || l.includes('key-two')));
  });
});

describe('start-up rules', () => {
  test('a non-loopback bind with no keys and no disable flag refuses to start (exit 2)', () => {
    const r = spawnSync(process.execPath, [join(ROOT, 'dist', 'src', 'main.js')], {
      env: {
        ...process.env,
        SERVICE_HOSTD_ADDR: '0.0.0.0:0',
        SERVICE_API_KEYS: '',
        SERVICE_AUTH_DISABLED: '',
      },
      encoding: 'utf8',
      // spawnSync blocks the runner's own timeout: a hang must still end the test.
      timeout: 300_000,
    });
    assert.equal(r.status, 2, `exit ${r.status} (${r.signal}): ${r.stderr}`);
    assert.notEqual(r.stderr.trim(), '', 'the reason is on stderr');
  });

  test('SERVICE_AUTH_DISABLED=1 logs a warning and lets requests in without a key', async () => {
    const hostd = await startHostd({
      env: { SERVICE_AUTH_DISABLED: '1', SERVICE_API_KEYS: 'ignored', SERVICE_POOL_SIZE: '0' },
    });
    try {
      // A warning (pino level 40 or above) that names the setting responsible; its wording
      // is free to change.
      const warnings = hostd.logs
        .flatMap((l) => {
          try {
            return [JSON.parse(l) as { level?: number; msg?: string }];
          } catch {
            return []; // not one of pino's lines
          }
        })
        .filter((l) => (l.level ?? 0) >= 40);
      assert.ok(
        warnings.some((l) => l.msg?.includes('SERVICE_AUTH_DISABLED')),
        JSON.stringify(warnings),
      );
      assert.equal((await hostd.request('GET', '/v1/sandboxes')).status, 200);
    } finally {
      await hostd.stop();
    }
  });
});
