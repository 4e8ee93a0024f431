// Snapshots: a sandbox's whole state kept on disk, to create sandboxes from.

import { createSandbox } from '../actions.js';
import { callJson, listSnapshots } from '../api.js';
import { confirmAction } from '../dialogs.js';
import { age, bytes, every, h, shortId, swap, table } from '../dom.js';
import { attempt } from '../status.js';

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderSnapshots(main, { signal }) {
  const body = h('div', { class: 'live' });
  main.append(
    h('h1', {}, 'Snapshots'),
    h(
      'p',
      { class: 'lead' },
      'Take one from a sandbox\u2019s page. Each can start any number of sandboxes.',
    ),
    body,
  );

  async function load() {
    const snapshots = await listSnapshots();
    const rows = snapshots.map((s) =>
      h(
        'tr',
        {},
        h('th', { scope: 'row' }, h('code', { title: s.snapshot_id }, shortId(s.snapshot_id))),
        h('td', {}, s.template),
        h('td', { title: s.source_sandbox_id }, shortId(s.source_sandbox_id)),
        h('td', { class: 'num' }, bytes(s.size_bytes)),
        h('td', { title: s.created_at }, `${age(s.created_at)} ago`),
        h('td', { class: 'num' }, String(s.sandboxes)),
        h(
          'td',
          {},
          h(
            'span',
            { class: 'actions' },
            h(
              'button',
              {
                type: 'button',
                class: 'small',
                'data-key': `new-${s.snapshot_id}`,
                'aria-label': `New sandbox from ${s.snapshot_id}`,
                onclick: async () => {
                  const id = await createSandbox(s.snapshot_id);
                  if (id) location.hash = `#/sandbox/${id}`;
                },
              },
              'New sandbox',
            ),
            h(
              'button',
              {
                type: 'button',
                class: 'small danger',
                'data-key': `delete-${s.snapshot_id}`,
                'aria-label': `Delete ${s.snapshot_id}`,
                onclick: async () => {
                  const ok = await confirmAction(
                    'Delete snapshot?',
                    `${s.snapshot_id} can no longer start sandboxes. Sandboxes made from it keep running.`,
                    'Delete',
                  );
                  if (!ok) return;
                  await attempt(
                    () => callJson('DELETE', `/v1/snapshots/${s.snapshot_id}`),
                    () => `Deleted ${shortId(s.snapshot_id)}.`,
                  );
                  await load();
                },
              },
              'Delete',
            ),
          ),
        ),
      ),
    );
    swap(
      body,
      table(
        'Snapshots',
        ['Snapshot', 'Template', 'From sandbox', 'Size', 'Taken', 'Sandboxes using it', 'Actions'],
        rows,
        'No snapshots yet.',
      ),
    );
  }
  await every(signal, 5000, load);
}
