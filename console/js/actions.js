// What a user can do to sandboxes, shared by the list, the lineage tree and a sandbox's page.
// Each asks first when it destroys state (delete, merge) and reports in the status line.

import { callJson, listTemplates } from './api.js';
import { confirmAction, formDialog } from './dialogs.js';
import { h, shortId } from './dom.js';
import { attempt } from './status.js';

/**
 * Asks for a template (and outbound network rules), then creates a sandbox.
 * @param {string} [snapshot] create from this snapshot instead of a template
 * @returns {Promise<string | null>} the new sandbox's id
 */
export async function createSandbox(snapshot) {
  const templates = snapshot ? [] : await listTemplates();
  const fields = [];
  if (!snapshot) {
    const ready = templates.filter((t) => t.state === 'ready');
    fields.push({
      name: 'template',
      label: 'Template',
      value: (ready.find((t) => t.default) ?? ready[0])?.name,
      options: templates.map((t) => ({
        value: t.name,
        label: t.state === 'ready' ? t.name : `${t.name} (${t.state})`,
      })),
    });
  }
  fields.push({
    name: 'allow_out',
    label: 'Outbound network (optional)',
    required: false,
    hint: 'Rules separated by commas, e.g. pypi.org:443, *.example.com. Empty: no network.',
  });
  const values = await formDialog(
    snapshot ? `New sandbox from ${shortId(snapshot)}` : 'New sandbox',
    fields,
    'Create',
  );
  if (!values) return null;
  const rules = (values.allow_out ?? '')
    .split(',')
    .map((r) => r.trim())
    .filter(Boolean);
  /** @type {Record<string, unknown>} */
  const body = snapshot ? { snapshot } : { template: values.template };
  if (rules.length) body.network = { allow_out: rules };
  const made = await attempt(
    () => callJson('POST', '/v1/sandboxes', body),
    (r) => `Created ${/** @type {{ id: string }} */ (r).id}.`,
  );
  return made ? /** @type {{ id: string }} */ (made).id : null;
}

/**
 * @param {string} id
 * @returns {Promise<string[] | null>} the children's ids
 */
export async function forkSandbox(id) {
  const values = await formDialog(
    `Fork ${shortId(id)}`,
    [
      {
        name: 'n',
        label: 'Children',
        type: 'number',
        value: '2',
        min: 1,
        max: 32,
        hint: 'Each child starts from this sandbox as it is now: memory, files and processes.',
      },
    ],
    'Fork',
  );
  if (!values) return null;
  const r = await attempt(
    () => callJson('POST', `/v1/sandboxes/${id}/fork`, { n: Number(values.n) }),
    (r) =>
      `Forked ${shortId(id)} into ${/** @type {{ children: unknown[] }} */ (r).children.length}.`,
  );
  return r ? /** @type {{ children: { id: string }[] }} */ (r).children.map((c) => c.id) : null;
}

/**
 * The parent adopts the winner's state; the parent's own state and the winner's id are gone.
 * @param {string} parent
 * @param {string} winner
 */
export async function mergeInto(parent, winner) {
  const ok = await confirmAction(
    'Merge into parent?',
    `${parent} will take over the state of ${winner}. Its own current state is destroyed, ` +
      `and ${winner} stops existing under its own id.`,
    'Merge',
  );
  if (!ok) return false;
  return !!(await attempt(
    () => callJson('POST', `/v1/sandboxes/${parent}/merge_into/${winner}`),
    () => `Merged ${shortId(winner)} into ${shortId(parent)}.`,
  ));
}

/** @param {string} id */
export async function pauseSandbox(id) {
  return !!(await attempt(
    () => callJson('POST', `/v1/sandboxes/${id}/pause`),
    () => `Paused ${shortId(id)}: written to disk, no memory used.`,
  ));
}

/** @param {string} id */
export async function resumeSandbox(id) {
  return !!(await attempt(
    () => callJson('POST', `/v1/sandboxes/${id}/resume`),
    () => `Resumed ${shortId(id)}.`,
  ));
}

/** @param {string} id */
export async function snapshotSandbox(id) {
  return attempt(
    () => callJson('POST', `/v1/sandboxes/${id}/snapshot`),
    (r) => `Snapshot ${/** @type {{ snapshot_id: string }} */ (r).snapshot_id} taken.`,
  );
}

/** @param {string} id */
export async function deleteSandbox(id) {
  const ok = await confirmAction(
    'Delete sandbox?',
    `${id} and everything in it (variables, processes, files) is destroyed. This cannot be undone.`,
    'Delete',
  );
  if (!ok) return false;
  return !!(await attempt(
    () => callJson('DELETE', `/v1/sandboxes/${id}`),
    () => `Deleted ${shortId(id)}.`,
  ));
}

/**
 * A row of buttons for a sandbox's actions; `after` runs once one changed something.
 * @param {import('./api.js').Sandbox} s
 * @param {() => void} after
 * @param {{ parentAlive?: boolean }} [opts]
 */
export function sandboxButtons(s, after, opts = {}) {
  /**
   * @param {string} label
   * @param {string} verb for the key that keeps focus across refreshes
   * @param {() => Promise<unknown>} run
   * @param {boolean} [danger]
   */
  const button = (label, verb, run, danger = false) =>
    h(
      'button',
      {
        type: 'button',
        class: danger ? 'danger small' : 'small',
        'data-key': `${verb}-${s.id}`,
        'aria-label': `${label} ${s.id}`,
        onclick: async (e) => {
          const b = /** @type {HTMLButtonElement} */ (e.currentTarget);
          b.disabled = true;
          try {
            if (await run()) after();
          } finally {
            b.disabled = false;
          }
        },
      },
      label,
    );
  const usable = s.state !== 'failed';
  return h(
    'span',
    { class: 'actions' },
    usable ? button('Fork', 'fork', () => forkSandbox(s.id)) : null,
    s.parent_id && opts.parentAlive
      ? button(
          'Merge into parent',
          'merge',
          () => mergeInto(/** @type {string} */ (s.parent_id), s.id),
          true,
        )
      : null,
    s.state === 'ready' ? button('Pause', 'pause', () => pauseSandbox(s.id)) : null,
    s.state === 'paused' ? button('Resume', 'resume', () => resumeSandbox(s.id)) : null,
    usable ? button('Snapshot', 'snapshot', () => snapshotSandbox(s.id)) : null,
    button('Delete', 'delete', () => deleteSandbox(s.id), true),
  );
}
