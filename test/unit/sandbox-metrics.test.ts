/** The per-sandbox metrics history (core/sandbox-metrics.ts), on a fake clock and fake machines. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MetricsSampler, SAMPLE_SLICE } from '../../src/core/sandbox-metrics.js';
import type { Sandbox } from '../../src/core/sandbox.js';
import type { MachineUsage } from '../../src/vm/machine.js';

const MiB = 1024 * 1024;

function fakeSandbox(id: string, usage: () => MachineUsage | Error): Sandbox {
  const machine = {
    alive: true,
    usage: () => {
      const u = usage();
      if (u instanceof Error) throw u;
      return u;
    },
  };
  return { id, machine, brokenReason: null } as unknown as Sandbox;
}

test('samples CPU as a share of the vCPUs since the last sample, memory at most the RAM, disk as written', async () => {
  let now = 1_000_000_000_000;
  let cpu = 10;
  const a = fakeSandbox('a', () => ({
    cpuSeconds: cpu,
    memoryBytes: 2048 * MiB,
    diskBytes: 5 * MiB,
  }));
  const sampler = new MetricsSampler(
    () => [a],
    () => ({ vcpus: 2, memoryMib: 1024, diskMib: 8192 }),
    () => now,
  );
  await sampler.sample();
  now += 5000;
  cpu += 2.5; // 2.5 s of CPU in 5 s on 2 vCPUs: 25 %
  await sampler.sample();
  const [first, second] = sampler.samples('a');
  assert.equal(first!.cpuUsedPct, 0, 'no earlier reading: no rate yet');
  assert.equal(second!.cpuUsedPct, 25);
  assert.equal(second!.cpuCount, 2);
  assert.equal(
    second!.memUsedBytes,
    1024 * MiB,
    'the QEMU overhead above the RAM is not the guest',
  );
  assert.equal(second!.memTotalBytes, 1024 * MiB);
  assert.equal(second!.diskUsedBytes, 5 * MiB);
  assert.equal(second!.diskTotalBytes, 8192 * MiB);
  assert.equal(second!.timestamp - first!.timestamp, 5000);
});

test('filters by time, forgets a deleted sandbox, skips machines that cannot tell', async () => {
  let now = 2_000_000_000_000;
  const a = fakeSandbox('a', () => ({ cpuSeconds: 1, memoryBytes: MiB, diskBytes: 0 }));
  const gone = fakeSandbox('gone', () => new Error('exited'));
  const sampler = new MetricsSampler(
    () => [a, gone],
    () => ({ vcpus: 1, memoryMib: 512, diskMib: 1024 }),
    () => now,
  );
  for (let i = 0; i < 4; i++) {
    await sampler.sample();
    now += 5000;
  }
  const start = 2_000_000_000_000;
  assert.equal(sampler.samples('a').length, 4);
  assert.equal(sampler.samples('a', start + 5000, start + 10_000).length, 2);
  assert.deepEqual(sampler.samples('a', start - 3_600_000, start - 1_800_000), []);
  assert.deepEqual(sampler.samples('gone'), []);
  sampler.forget('a');
  assert.deepEqual(sampler.samples('a'), []);
});

test('keeps the last 30 minutes', async () => {
  let now = 3_000_000_000_000;
  const a = fakeSandbox('a', () => ({ cpuSeconds: 1, memoryBytes: MiB, diskBytes: 0 }));
  const sampler = new MetricsSampler(
    () => [a],
    () => ({ vcpus: 1, memoryMib: 512, diskMib: 1024 }),
    () => now,
  );
  for (let i = 0; i < 400; i++) {
    await sampler.sample();
    now += 5000;
  }
  const samples = sampler.samples('a');
  assert.ok(samples.length <= 361, `${samples.length} samples kept`);
  assert.ok(samples.at(-1)!.timestamp - samples[0]!.timestamp <= 30 * 60_000);
});

test('reads many sandboxes a slice per turn of the event loop, not all in one', async () => {
  // Each read is synchronous; what lets an exec's answer through between them is the turn.
  let readsThisTurn = 0;
  let mostInOneTurn = 0;
  let turns = 0;
  const sandboxes = Array.from({ length: 10 * SAMPLE_SLICE + 3 }, (_, i) =>
    fakeSandbox(`s${i}`, () => {
      if (readsThisTurn === 0) {
        turns++;
        setImmediate(() => (readsThisTurn = 0));
      }
      mostInOneTurn = Math.max(mostInOneTurn, ++readsThisTurn);
      return { cpuSeconds: 1, memoryBytes: MiB, diskBytes: 0 };
    }),
  );
  const sampler = new MetricsSampler(
    () => sandboxes,
    () => ({ vcpus: 1, memoryMib: 512, diskMib: 1024 }),
  );
  await sampler.sample();
  assert.equal(mostInOneTurn, SAMPLE_SLICE);
  assert.equal(turns, 11);
  for (const s of sandboxes) assert.equal(sampler.samples(s.id).length, 1, s.id);
});
