// The fork and merge lineage as a tree: each sandbox under the one it was forked from, and each
// merge as a node under the sandbox that adopted the winner (from `merged_from`: the winner's
// own id is gone after a merge). A parent that was deleted stays as a "gone" node so that its
// children keep their place.

import { sandboxButtons } from '../actions.js';
import { listSandboxes } from '../api.js';
import { age, every, h, shortId, stateBadge, swap } from '../dom.js';
import { memory, sandboxState } from './sandboxes.js';

/** @typedef {import('../api.js').Sandbox} Sandbox */

/**
 * @typedef {{ id: string, sandbox: Sandbox | null, mergedInto: string | null, mergedAt: string | null,
 *   children: string[] }} TreeNode
 */

/**
 * The lineage of the sandboxes alive now: nodes by id (gone ones included) and the roots.
 * @param {Sandbox[]} sandboxes
 */
export function lineage(sandboxes) {
  /** @type {Map<string, TreeNode>} */
  const nodes = new Map();
  /** @param {string} id */
  const node = (id) => {
    let n = nodes.get(id);
    if (!n) {
      n = { id, sandbox: null, mergedInto: null, mergedAt: null, children: [] };
      nodes.set(id, n);
    }
    return n;
  };
  const byAge = [...sandboxes].sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at));
  for (const s of byAge) node(s.id).sandbox = s;
  for (const s of byAge) {
    for (const m of s.merged_from ?? []) {
      if (nodes.get(m.id)?.sandbox) continue;
      const gone = node(m.id);
      gone.mergedInto = s.id;
      gone.mergedAt = m.merged_at;
      node(s.id).children.push(m.id);
    }
  }
  for (const s of byAge) if (s.parent_id) node(s.parent_id).children.push(s.id);
  const roots = [...nodes.values()].filter((n) =>
    n.sandbox ? !n.sandbox.parent_id : n.mergedInto === null,
  );
  return { nodes, roots: roots.map((n) => n.id) };
}

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderLineage(main, { signal }) {
  const body = h('div', { class: 'live' });
  main.append(
    h('h1', {}, 'Lineage'),
    h(
      'p',
      { class: 'lead' },
      'Each sandbox sits under the one it was forked from; ',
      h('span', { class: 'state state-merged' }, '⤶ merged'),
      ' marks a winner merged into the sandbox above it (its id is gone: the parent runs its state).',
    ),
    body,
  );

  async function load() {
    const sandboxes = await listSandboxes();
    const { nodes, roots } = lineage(sandboxes);
    /** @type {Set<string>} */
    const drawn = new Set();
    /** @param {string} id @returns {HTMLElement | null} */
    const draw = (id) => {
      if (drawn.has(id)) return null;
      drawn.add(id);
      const n = /** @type {TreeNode} */ (nodes.get(id));
      const kids = n.children.map(draw).filter((k) => k !== null);
      return h('li', {}, row(n, nodes, load), kids.length ? h('ul', {}, kids) : null);
    };
    const items = roots.map(draw);
    // Nodes no root reaches (a sandbox that adopted its own ancestor by merge) are drawn too.
    for (const id of nodes.keys()) if (!drawn.has(id)) items.push(draw(id));
    swap(
      body,
      items.length
        ? h('ul', { class: 'tree', 'aria-label': 'Sandbox lineage' }, items)
        : h('p', { class: 'empty' }, 'No sandboxes yet.'),
    );
  }
  await every(signal, 2000, load);
}

/**
 * @param {TreeNode} n
 * @param {Map<string, TreeNode>} nodes
 * @param {() => Promise<void>} reload
 */
function row(n, nodes, reload) {
  const s = n.sandbox;
  if (!s) {
    return h(
      'div',
      { class: 'node node-gone' },
      h('code', { title: n.id }, shortId(n.id)),
      ' ',
      n.mergedInto
        ? stateBadge('merged', `merged in ${n.mergedAt ? `${age(n.mergedAt)} ago` : ''}`)
        : stateBadge('gone', 'gone (deleted)'),
    );
  }
  const parentAlive = !!s.parent_id && !!nodes.get(s.parent_id)?.sandbox;
  return h(
    'div',
    { class: 'node' },
    h('a', { href: `#/sandbox/${s.id}`, title: s.id, 'data-key': `open-${s.id}` }, shortId(s.id)),
    ' ',
    sandboxState(s),
    h(
      'span',
      { class: 'meta' },
      ` ${s.template} · ${age(s.created_at)} · ${memory(s.memory_mib)}`,
      s.snapshot_id ? ` · from ${shortId(s.snapshot_id)}` : '',
    ),
    ' ',
    sandboxButtons(s, () => void reload(), { parentAlive }),
  );
}
