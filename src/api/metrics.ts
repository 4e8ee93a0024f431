/**
 * Prometheus metrics (prom-client), served at GET /metrics behind the same auth as the API.
 * The core reports through ManagerObserver hooks so that it never depends on prom-client.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ManagerObserver, SandboxManager } from '../core/sandbox-manager.js';

export interface Metrics {
  registry: Registry;
  observer: ManagerObserver;
  /** Binds the gauges that read live state (sandboxes alive, pool sizes) to a manager. */
  bind(manager: SandboxManager): void;
}

/**
 * How often the event loop's delay is sampled for `hostd_process_nodejs_eventloop_lag_*` (ms).
 * prom-client's default, 10, is a timer that wakes hostd 100 times a second, idle or not: two
 * `epoll_pwait` and a histogram update each time, on a host where every wake-up lands on cold
 * caches (docs/architecture.md, "Exec latency on a slow TCG host"). At 100 the lag figures
 * are sampled 10 times a second, which still shows a loop that stalls.
 */
export const EVENT_LOOP_SAMPLE_MS = 100;

/** `info` labels a constant gauge so dashboards (and the benchmark) can see how hostd runs. */
export function createMetrics(info: { accel: string; version: string }): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({
    register: registry,
    prefix: 'hostd_process_',
    eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS,
  });
  new Gauge({
    name: 'hostd_info',
    help: 'Constant 1, labelled with the accelerator and the hostd version.',
    labelNames: ['accel', 'version'],
    registers: [registry],
  }).set(info, 1);
  let manager: SandboxManager | null = null;

  new Gauge({
    name: 'hostd_sandboxes_alive',
    help: 'Sandboxes that exist now (pooled VMs not included).',
    registers: [registry],
    collect() {
      this.set(manager?.count ?? 0);
    },
  });
  new Gauge({
    name: 'hostd_pool_ready',
    help: 'Restored VMs waiting in each template pool.',
    labelNames: ['template'],
    registers: [registry],
    collect() {
      for (const s of manager?.poolStats() ?? []) this.set({ template: s.template }, s.ready);
    },
  });
  new Gauge({
    name: 'hostd_sandbox_network_bytes',
    help: 'Bytes the connections of the sandboxes alive now sent out and received (their `network`).',
    labelNames: ['direction'],
    registers: [registry],
    collect() {
      let out = 0;
      let inward = 0;
      for (const s of manager?.list() ?? []) {
        out += s.network.bytes_out;
        inward += s.network.bytes_in;
      }
      this.set({ direction: 'out' }, out);
      this.set({ direction: 'in' }, inward);
    },
  });
  new Gauge({
    name: 'hostd_storage_bytes',
    help: 'Disk that snapshots and paused sandboxes take, as counted against SERVICE_MAX_STORAGE_MIB.',
    registers: [registry],
    collect() {
      this.set(manager?.storageBytes() ?? 0);
    },
  });
  new Gauge({
    name: 'hostd_fork_standby_vms',
    help: 'QEMU processes started ahead on a copy of a template image, waiting for forks.',
    registers: [registry],
    collect() {
      this.set(manager?.forkStandby().vms ?? 0);
    },
  });
  new Gauge({
    name: 'hostd_fork_standby_filling',
    help: '1 while hostd is copying a template image or starting standby QEMUs for forks.',
    registers: [registry],
    collect() {
      this.set(manager?.forkStandby().filling ? 1 : 0);
    },
  });
  const execSeconds = new Histogram({
    name: 'hostd_exec_duration_seconds',
    help: 'Wall time of execs from start to exit on the VM.',
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300],
    registers: [registry],
  });
  const forkSeconds = new Histogram({
    name: 'hostd_fork_duration_seconds',
    help: 'Wall time of forks until every child answers.',
    labelNames: ['n'],
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
    registers: [registry],
  });
  const createSeconds = new Histogram({
    name: 'hostd_create_duration_seconds',
    help: 'Wall time of sandbox creation, by pool hit or miss.',
    labelNames: ['pool'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5],
    registers: [registry],
  });
  const vmStartFailures = new Counter({
    name: 'hostd_vm_start_failures_total',
    help: 'VM restores or boots that failed.',
    registers: [registry],
  });
  const execsRunning = new Gauge({
    name: 'hostd_execs_running',
    help: 'Execs running now.',
    registers: [registry],
  });

  return {
    registry,
    bind(m) {
      manager = m;
    },
    observer: {
      execStarted: () => execsRunning.inc(),
      execFinished: (s) => {
        execsRunning.dec();
        execSeconds.observe(s);
      },
      forked: (n, s) => forkSeconds.observe({ n: String(n) }, s),
      created: (hit, s) => createSeconds.observe({ pool: hit ? 'hit' : 'miss' }, s),
      vmStartFailed: () => vmStartFailures.inc(),
    },
  };
}
