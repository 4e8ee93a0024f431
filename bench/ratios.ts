/**
 * Control-plane figures as multiples of the no-VM baselines measured in the same run (issue 29:
 * a run on a slower machine of the same kind should be comparable to ours). A time is divided
 * by `baseline_no_vm_ms` (the host's plain Python speed; the mean of the run's first and last
 * measurement, since a shared host drifts), and an exec's round trip also by
 * `baseline_local_repl_exec_p50_ms` (the same REPL worker over a local pipe: the floor). A ratio
 * that grows between machines is ours to explain; one that stays put is the host.
 */
import type { Results } from './util.js';

/** The figures with a `_per_baseline` ratio, when the run measured them. */
export const CONTROL_PLANE_FIGURES = [
  'create_pool_hit_p50_ms',
  'exec_print_p50_ms',
  'exec_print_p99_ms',
  'exec_print_qemu_cpu_ms',
  'exec_print_hostd_cpu_ms',
  'exec_print_p50_ms_100_idle',
  'exec_print_p99_ms_100_idle',
  'fork_n8_ms',
  'fork_n32_ms',
  'fork_child_cpu_ms',
  'files_small_rw_p50_ms',
  'display_png_p50_ms',
  'pause_ms',
  'resume_ms',
] as const;

/** The ratios of `results`' control-plane figures, rounded to 3 significant digits. */
export function baselineRatios(results: Results): Results {
  const ratios: Results = {};
  const round = (x: number): number => Number(x.toPrecision(3));
  const baselines = [results.baseline_no_vm_ms, results.baseline_no_vm_ms_at_end].filter(
    (b): b is number => typeof b === 'number' && b > 0,
  );
  if (baselines.length > 0) {
    const base = baselines.reduce((a, b) => a + b, 0) / baselines.length;
    for (const k of CONTROL_PLANE_FIGURES) {
      const v = results[k];
      if (typeof v === 'number') ratios[`${k}_per_baseline`] = round(v / base);
    }
  }
  const exec = results.exec_print_p50_ms;
  const floor = results.baseline_local_repl_exec_p50_ms;
  if (typeof exec === 'number' && typeof floor === 'number' && floor > 0) {
    ratios.exec_print_p50_per_local_repl = round(exec / floor);
  }
  return ratios;
}
