/**
 * The sandbox cap that follows host memory, and the two answers at its edges: 429 once the count
 * is reached, 503 once the memory left would fall under the reserve. Exact at the edge: the last
 * sandbox that fits is admitted, the next is not.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { pino } from 'pino';
import {
  Admission,
  CAP_RESERVE_MIB,
  IDLE_SANDBOX_MIB,
  IDLE_TCG_TB_MIB,
  idleSandboxMib,
  sandboxCapFor,
  sandboxSizing,
} from '../../src/core/admission.js';
import {
  cachedHostFree,
  hostFree,
  hostMemTotalMib,
  readMeminfo,
  type HostFree,
} from '../../src/core/host-resources.js';
import { HostdError } from '../../src/errors.js';
import { SandboxManager } from '../../src/core/sandbox-manager.js';
import { FakeHypervisor } from '../helpers/fake-hypervisor.js';
import { FakeImages, plan } from '../helpers/fake-images.js';
import { setupOptions } from '../helpers/manager.js';

function refusal(fn: () => unknown): HostdError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof HostdError, `not a HostdError: ${String(err)}`);
    return err;
  }
  return assert.fail('expected a refusal');
}

describe('sandboxCapFor', () => {
  test('is the host memory less the reserve, divided by the cost of one sandbox', () => {
    assert.equal(sandboxCapFor(24 * 1024, 24), Math.floor((24 * 1024 - CAP_RESERVE_MIB) / 24));
    assert.equal(sandboxCapFor(2048 + 240, 24), 10);
    assert.equal(sandboxCapFor(2048 + 239, 24), 9);
  });

  test('is at least one, so a small host still serves', () => {
    assert.equal(sandboxCapFor(1024, 24), 1);
  });
});

describe('sandboxSizing', () => {
  test('an idle sandbox costs its fixed part, plus under TCG the part of the buffer an idle VM fills', () => {
    assert.equal(idleSandboxMib(null), IDLE_SANDBOX_MIB);
    assert.equal(idleSandboxMib(32), IDLE_SANDBOX_MIB + IDLE_TCG_TB_MIB);
    // A buffer smaller than what an idle VM fills is all counted, and no more.
    assert.equal(idleSandboxMib(8), IDLE_SANDBOX_MIB + 8);
  });

  test('without a configured cap, the cap follows host memory at that cost', () => {
    const memTotalMib = 24 * 1024;
    const sizing = sandboxSizing({ configuredMax: null, memTotalMib, tcgTbMib: 32 });
    assert.deepEqual(sizing, {
      perVmMib: IDLE_SANDBOX_MIB + IDLE_TCG_TB_MIB,
      maxSandboxes: sandboxCapFor(memTotalMib, IDLE_SANDBOX_MIB + IDLE_TCG_TB_MIB),
      fromHostMemory: true,
    });
    const kvm = sandboxSizing({ configuredMax: null, memTotalMib, tcgTbMib: null });
    assert.ok(kvm.maxSandboxes > sizing.maxSandboxes, 'no translation buffer, more sandboxes');
  });

  test('a configured cap is kept whatever the host memory; the cost still follows the accelerator', () => {
    const sizing = sandboxSizing({ configuredMax: 5, memTotalMib: 1 << 20, tcgTbMib: 32 });
    assert.deepEqual(sizing, {
      perVmMib: IDLE_SANDBOX_MIB + IDLE_TCG_TB_MIB,
      maxSandboxes: 5,
      fromHostMemory: false,
    });
  });
});

describe('Admission at its edges', () => {
  test('admits up to the cap and answers 429 for the next, counting pending starts', () => {
    let alive = 8;
    const a = new Admission(
      { maxSandboxes: 10, reserveMib: 100, perVmMib: 50 },
      () => ({ memAvailableMib: 1e6, dataDirFreeMib: 1e6 }),
      () => alive,
    );
    const release = a.admit(2);
    assert.equal(refusal(() => a.admit(1)).status, 429);
    release();
    alive = 9;
    a.admit(1);
    assert.equal(refusal(() => a.admit(1)).status, 429);
  });

  test('admits while exactly the reserve would stay free, and answers 503 a MiB short', () => {
    const free = { memAvailableMib: 3 * 50 + 100, dataDirFreeMib: 1e6 };
    const a = new Admission(
      { maxSandboxes: 100, reserveMib: 100, perVmMib: 50 },
      () => free,
      () => 0,
    );
    a.admit(3)();
    free.memAvailableMib -= 1;
    const err = refusal(() => a.admit(3));
    assert.equal(err.status, 503);
    assert.equal(err.entry, 'insufficientResources');
  });
});

describe('a manager with the cap derived from host memory', () => {
  test('creates exactly the derived number of sandboxes, then 429', async () => {
    const hv = new FakeHypervisor();
    const cap = sandboxCapFor(CAP_RESERVE_MIB + 3 * hv.machineOverheadMib, hv.machineOverheadMib);
    assert.equal(cap, 3);
    const manager = new SandboxManager(
      {
        ...setupOptions(),
        templates: [plan('slim', { memoryMib: 256, vcpus: 1, poolSize: 0 })],
        images: new FakeImages(['slim']),
        maxSandboxes: cap,
        forkStandbyMax: 0,
      },
      hv,
      pino({ level: 'silent' }),
    );
    await manager.start();
    const first = await manager.create({ template: 'slim' });
    await manager.create({ template: 'slim' });
    // A fork past the cap starts nothing; one that reaches it exactly is admitted.
    await assert.rejects(manager.fork(first.id, 2), (err: unknown) => {
      assert.ok(err instanceof HostdError);
      return err.status === 429;
    });
    assert.equal((await manager.fork(first.id, 1)).length, 1);
    await assert.rejects(manager.create({ template: 'slim' }), (err: unknown) => {
      assert.ok(err instanceof HostdError);
      return err.status === 429 && err.entry === 'sandboxLimit';
    });
    await manager.shutdown();
  });
});

describe('the reading of the host the admission checks against', () => {
  const reader = (): { read: () => HostFree; reads: () => number } => {
    let n = 0;
    return {
      read: () => ({ memAvailableMib: 1000 + n++, dataDirFreeMib: 5000 }),
      reads: () => n,
    };
  };

  test('a burst of checks within the reuse period reads the host once', () => {
    const r = reader();
    const free = cachedHostFree('/data', 1e9, r.read);
    assert.deepEqual(free(), { memAvailableMib: 1000, dataDirFreeMib: 5000 });
    assert.deepEqual(free(), { memAvailableMib: 1000, dataDirFreeMib: 5000 });
    assert.equal(r.reads(), 1);
  });

  test('once the reading is as old as the reuse period, the host is read again', () => {
    const r = reader();
    const free = cachedHostFree('/data', 0, r.read);
    free();
    assert.equal(free().memAvailableMib, 1001);
    assert.equal(r.reads(), 2);
  });

  test('a caller that changes its copy does not change the next answer', () => {
    const free = cachedHostFree('/data', 1e9, reader().read);
    free().memAvailableMib = 0;
    assert.equal(free().memAvailableMib, 1000);
  });

  test('/proc/meminfo read again through its kept descriptor is the whole file each time', () => {
    const fields = (text: string): string[] => text.split('\n').map((l) => l.split(':')[0]!);
    const fresh = readFileSync('/proc/meminfo', 'utf8');
    for (let i = 0; i < 3; i++) {
      const kept = readMeminfo();
      assert.ok(kept.endsWith('\n'));
      assert.deepEqual(fields(kept), fields(fresh));
    }
    const free = hostFree('/');
    assert.ok(free.memAvailableMib > 0 && Number.isFinite(free.memAvailableMib));
    assert.ok(hostMemTotalMib() >= free.memAvailableMib);
  });
});
