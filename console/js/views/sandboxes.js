// Every sandbox, live: state, template, age, memory (and node, when the API names one), with
// their actions.

import { createSandbox, sandboxButtons } from '../actions.js';
import { listSandboxes } from '../api.js';
import { age, every, h, shortId, stateBadge, swap, table } from '../dom.js';

/** @typedef {import('../api.js').Sandbox} Sandbox */

/**
 * The state a person reads: busy sandboxes say so, failed ones say why (in the title).
 * @param {Sandbox} s
 */
export function sandboxState(s) {
  if (s.state === 'ready' && s.busy) {
    return stateBadge('busy', s.queued ? `busy, ${s.queued} queued` : 'busy');
  }
  return stateBadge(s.state);
}

/** @param {number | null | undefined} mib */
export function memory(mib) {
  return mib === null || mib === undefined ? '—' : `${mib.toFixed(1)} MiB`;
}

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderSandboxes(main, { signal }) {
  const body = h('div', { class: 'live' });
  main.append(
    h(
      'div',
      { class: 'view-head' },
      h('h1', {}, 'Sandboxes'),
      h(
        'button',
        {
          type: 'button',
          class: 'primary',
          onclick: async () => {
            const id = await createSandbox();
            if (id) await load();
          },
        },
        'New sandbox',
      ),
    ),
    body,
  );

  async function load() {
    const sandboxes = await listSandboxes();
    const alive = new Set(sandboxes.map((s) => s.id));
    const withNode = sandboxes.some((s) => s.node !== undefined);
    const total = sandboxes.reduce((n, s) => n + (s.memory_mib ?? 0), 0);
    const columns = ['Sandbox', 'State', 'Template', 'Age', 'Memory'];
    if (withNode) columns.push('Node');
    columns.push('Forked from', 'Actions');
    const rows = sandboxes.map((s) =>
      h(
        'tr',
        {},
        h(
          'th',
          { scope: 'row' },
          h(
            'a',
            { href: `#/sandbox/${s.id}`, title: s.id, 'data-key': `open-${s.id}` },
            shortId(s.id),
          ),
        ),
        h('td', { title: s.error ?? '' }, sandboxState(s)),
        h('td', {}, s.template),
        h('td', { title: s.created_at }, age(s.created_at)),
        h('td', { class: 'num' }, memory(s.memory_mib)),
        withNode ? h('td', {}, s.node ?? '—') : null,
        h(
          'td',
          {},
          s.parent_id
            ? alive.has(s.parent_id)
              ? h(
                  'a',
                  { href: `#/sandbox/${s.parent_id}`, title: s.parent_id },
                  shortId(s.parent_id),
                )
              : h('span', { title: s.parent_id }, `${shortId(s.parent_id)} (gone)`)
            : s.snapshot_id
              ? h('span', { title: s.snapshot_id }, `snapshot ${shortId(s.snapshot_id)}`)
              : '—',
        ),
        h(
          'td',
          {},
          sandboxButtons(s, () => void load(), {
            parentAlive: !!s.parent_id && alive.has(s.parent_id),
          }),
        ),
      ),
    );
    swap(
      body,
      h(
        'p',
        { class: 'summary' },
        `${sandboxes.length} sandbox${sandboxes.length === 1 ? '' : 'es'}, ` +
          `${total.toFixed(1)} MiB of their own memory.`,
      ),
      table('Sandboxes', columns, rows, 'No sandboxes yet. Create one with "New sandbox".'),
    );
  }
  await every(signal, 2000, load);
}
