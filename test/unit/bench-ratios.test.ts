import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { baselineRatios } from '../../bench/ratios.js';

describe("the bench's ratios to the no-VM baselines", () => {
  test('divide each control-plane figure by the mean of the baselines at both ends of the run', () => {
    const ratios = baselineRatios({
      baseline_no_vm_ms: 90,
      baseline_no_vm_ms_at_end: 110,
      exec_print_p50_ms: 5,
      fork_n8_ms: 300,
      baseline_local_repl_exec_p50_ms: 0.5,
    });
    assert.deepEqual(ratios, {
      exec_print_p50_ms_per_baseline: 0.05,
      fork_n8_ms_per_baseline: 3,
      exec_print_p50_per_local_repl: 10,
    });
  });

  test('leave out what the run did not measure, or measured as skipped', () => {
    const ratios = baselineRatios({
      baseline_no_vm_ms: 100,
      pause_ms: 'skipped: no pause route',
      resume_ms: null,
    });
    assert.deepEqual(ratios, {});
    assert.deepEqual(baselineRatios({ exec_print_p50_ms: 5 }), {});
  });
});
