import assert from 'node:assert/strict';
import { availableParallelism } from 'node:os';
import { describe, test } from 'node:test';
import { hostWakeBaselines } from '../../bench/host-wake.js';

describe("the bench's wake-up baselines", () => {
  test('give a round trip on one CPU, and across two when the host has two', () => {
    const { baseline_wake_same_cpu_us: same, baseline_wake_cross_cpu_us: cross } =
      hostWakeBaselines();
    assert.ok(typeof same === 'number' && same > 0, `same CPU: ${same}`);
    if (availableParallelism() > 1) assert.ok(typeof cross === 'number' && cross > 0);
    else assert.equal(cross, null);
  });
});
