// The host's figures, from GET /metrics (Prometheus text): what runs, how busy it is, what
// hostd itself uses.

import { call, listSandboxes } from '../api.js';
import { bytes, every, h, swap } from '../dom.js';
import { metric, parseMetrics } from '../metrics.js';

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderHost(main, { signal }) {
  const body = h('div', { class: 'live' });
  main.append(h('h1', {}, 'Host'), body);

  async function load() {
    const text = await (await call('GET', '/metrics')).text();
    const samples = parseMetrics(text);
    const sandboxes = await listSandboxes();
    const info = samples.find((s) => s.name === 'hostd_info')?.labels ?? {};
    /** @param {string} name @param {Record<string, string>} [labels] */
    const n = (name, labels) => metric(samples, name, labels) ?? 0;
    /** @param {string} name */
    const mean = (name) => {
      const count = n(`${name}_count`);
      return count
        ? `${((n(`${name}_sum`) / count) * 1000).toFixed(0)} ms average of ${count}`
        : 'none yet';
    };
    const started = n('hostd_process_start_time_seconds');
    const pools = samples.filter((s) => s.name === 'hostd_pool_ready');
    /** @type {[string, string][]} */
    const figures = [
      ['hostd version', info.version ?? '?'],
      ['Accelerator', info.accel ?? '?'],
      ['Up for', started ? `${Math.round((Date.now() / 1000 - started) / 60)} min` : '?'],
      ['Sandboxes alive', String(n('hostd_sandboxes_alive'))],
      ['Running', String(sandboxes.filter((s) => s.state === 'ready').length)],
      ['Paused', String(sandboxes.filter((s) => s.state === 'paused').length)],
      ['Failed', String(sandboxes.filter((s) => s.state === 'failed').length)],
      [
        'Their own memory',
        `${sandboxes.reduce((t, s) => t + (s.memory_mib ?? 0), 0).toFixed(1)} MiB`,
      ],
      ['Execs running', String(n('hostd_execs_running'))],
      ['Execs', mean('hostd_exec_duration_seconds')],
      ['Forks', mean('hostd_fork_duration_seconds')],
      ['Creates', mean('hostd_create_duration_seconds')],
      ['VM start failures', String(n('hostd_vm_start_failures_total'))],
      ['Fork standby VMs', String(n('hostd_fork_standby_vms'))],
      ['Snapshots and paused sandboxes on disk', bytes(n('hostd_storage_bytes'))],
      [
        'Network out / in',
        `${bytes(n('hostd_sandbox_network_bytes', { direction: 'out' }))} / ${bytes(n('hostd_sandbox_network_bytes', { direction: 'in' }))}`,
      ],
      ['hostd memory (resident)', bytes(n('hostd_process_resident_memory_bytes'))],
      ['hostd CPU time', `${n('hostd_process_cpu_seconds_total').toFixed(1)} s`],
    ];
    for (const p of pools) figures.push([`Warm pool: ${p.labels.template}`, `${p.value} ready`]);
    swap(
      body,
      h(
        'dl',
        { class: 'facts figures' },
        figures.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
      ),
    );
  }
  await every(signal, 3000, load);
}
