/**
 * How much a wake-up costs on this host: a byte sent back and forth between two processes over
 * pipes, both on one CPU and on two (issue 29). An exec is a chain of such wake-ups (the client,
 * hostd, QEMU's main loop, the vCPU thread and back, plus the main loop's and the vCPU's handing
 * of QEMU's global lock to each other), so a host where a wake-up that crosses CPUs is slow (a
 * cloud VM that halts its idle vCPUs, a nested hypervisor that traps every IPI) pays it many
 * times per exec while its plain Python speed (`baseline_no_vm_ms`) looks normal. Measured with
 * the host's python3, like the other baselines.
 */
import { spawnSync } from 'node:child_process';
import type { Results } from './util.js';

const PING_PONG = `
import os, time
def rt(a, b, n=4000, warm=400):
    r1, w1 = os.pipe(); r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {b})
        for _ in range(n + warm):
            os.read(r1, 1); os.write(w2, b"x")
        os._exit(0)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {a})
    for i in range(n + warm):
        if i == warm:
            t = time.perf_counter()
        os.write(w1, b"x"); os.read(r2, 1)
    d = (time.perf_counter() - t) / n * 1e6
    os.waitpid(pid, 0)
    os.sched_setaffinity(0, mask)
    return round(d, 1)
cpus = sorted(os.sched_getaffinity(0))
print(rt(cpus[0], cpus[0]), rt(cpus[0], cpus[1]) if len(cpus) > 1 else "null")
`;

/**
 * Microseconds per round trip (two wake-ups): `baseline_wake_same_cpu_us` with both processes
 * on one CPU, `baseline_wake_cross_cpu_us` on two (null on a one-CPU host). Unlike the figures
 * measured through a VM, these hardly depend on load: a loaded CPU rarely halts.
 */
export function hostWakeBaselines(): Results {
  const r = spawnSync('python3', ['-c', PING_PONG], { encoding: 'utf8', timeout: 60_000 });
  const [same, cross] = (r.stdout ?? '').trim().split(' ');
  const num = (s: string | undefined): number | null =>
    s !== undefined && s !== '' && Number.isFinite(Number(s)) ? Number(s) : null;
  return { baseline_wake_same_cpu_us: num(same), baseline_wake_cross_cpu_us: num(cross) };
}
