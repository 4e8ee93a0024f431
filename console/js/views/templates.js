// Templates: what sandboxes are made from, whether each is built, and why a build failed
// (its error, and the end of its build log).

import { call, listTemplates } from '../api.js';
import { showText } from '../dialogs.js';
import { age, every, h, stateBadge, swap, table } from '../dom.js';
import { notify } from '../status.js';

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderTemplates(main, { signal }) {
  const body = h('div', { class: 'live' });
  main.append(h('h1', {}, 'Templates'), body);

  /** @param {string} name */
  async function showLog(name) {
    try {
      const res = await call('GET', `/v1/templates/${encodeURIComponent(name)}/log`);
      await showText(`Build log of ${name}`, await res.text());
    } catch (err) {
      notify(/** @type {Error} */ (err).message, 'error');
    }
  }

  async function load() {
    const templates = await listTemplates();
    const rows = templates.map((t) =>
      h(
        'tr',
        {},
        h(
          'th',
          { scope: 'row' },
          t.name,
          t.default ? h('span', { class: 'tag' }, ' (default)') : '',
        ),
        h('td', {}, stateBadge(t.state)),
        h('td', {}, t.description),
        h('td', { class: 'num' }, `${t.memory_mib} MiB · ${t.vcpus} vCPU`),
        h('td', { class: 'num' }, String(t.pool_size)),
        h('td', {}, t.built_at ? `${age(t.built_at)} ago` : '—'),
        h(
          'td',
          {},
          h(
            'button',
            {
              type: 'button',
              class: 'small',
              'data-key': `log-${t.name}`,
              'aria-label': `Build log of ${t.name}`,
              onclick: () => void showLog(t.name),
            },
            'Build log',
          ),
        ),
      ),
    );
    const failed = templates.filter((t) => t.state === 'failed');
    swap(
      body,
      table(
        'Templates',
        ['Template', 'State', 'Description', 'Machine', 'Warm pool', 'Built', 'Log'],
        rows,
      ),
      failed.length
        ? h(
            'section',
            { 'aria-labelledby': 'failed-title' },
            h('h2', { id: 'failed-title' }, 'Failed builds'),
            failed.map((t) =>
              h(
                'div',
                { class: 'failure' },
                h('h3', {}, t.name),
                h('pre', { class: 'log', tabindex: 0 }, t.error ?? ''),
              ),
            ),
          )
        : null,
    );
  }
  await every(signal, 5000, load);
}
