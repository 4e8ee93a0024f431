// Building the page from data: elements are made with `h` and text is always set as text, so
// nothing a sandbox or a server sends is ever parsed as HTML in the console's origin.

import { notify } from './status.js';

/**
 * @typedef {string | number | boolean | null | undefined | Node} Child
 * @typedef {Record<string, string | number | boolean | null | undefined | EventListener>} Attrs
 */

/**
 * An element with attributes (`on…` ones become listeners; `false`/null ones are left out) and
 * children (strings become text nodes; null and false are skipped).
 * @example h('button', { type: 'button', onclick: go }, 'Go')
 * @param {string} tag
 * @param {Attrs} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElement}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

/**
 * @param {Element} el
 * @param {(Child | Child[])[]} children
 */
function append(el, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/**
 * Replaces `container`'s children, keeping keyboard focus on the element with the same
 * `data-key` (a live view re-renders every few seconds: focus must not jump away).
 * @param {Element} container
 * @param {...(Child | Child[])} children
 */
export function swap(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.getAttribute('data-key') : null;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = container.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again instanceof HTMLElement) again.focus();
  }
}

/** @param {string} iso */
export function age(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d`;
}

/** @param {number} n */
export function bytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** @param {string} id A sandbox or snapshot id, shortened for tables (the full id in `title`). */
export function shortId(id) {
  return id.length > 16 ? `${id.slice(0, 12)}…` : id;
}

/**
 * States are words with a symbol, never colour alone: the colour is only a class on top.
 * @type {Record<string, string>}
 */
const STATE_SYMBOLS = {
  ready: '●',
  paused: '⏸',
  failed: '✖',
  lost: '✖',
  building: '⋯',
  busy: '▶',
  gone: '○',
  merged: '⤶',
};

/**
 * @param {string} state
 * @param {string} [label] the text to show when it is not the state's own name
 */
export function stateBadge(state, label = state) {
  return h(
    'span',
    { class: `state state-${state}` },
    h('span', { 'aria-hidden': 'true' }, STATE_SYMBOLS[state] ?? '•'),
    ` ${label}`,
  );
}

/**
 * A table whose header cells are column headers, with a caption for screen readers, wrapped
 * so it scrolls sideways on a narrow screen instead of overflowing the page.
 * @param {string} caption
 * @param {string[]} columns
 * @param {HTMLElement[]} rows
 * @param {string} [empty] what to say when there is no row
 */
export function table(caption, columns, rows, empty = 'None.') {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h(
    'div',
    { class: 'table-wrap', role: 'region', 'aria-label': caption, tabindex: 0 },
    h(
      'table',
      {},
      h('caption', { class: 'visually-hidden' }, caption),
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          columns.map((c) => h('th', { scope: 'col' }, c)),
        ),
      ),
      h('tbody', {}, rows),
    ),
  );
}

/**
 * Runs `fn` now and every `ms` while `signal` is live and the page is visible: the views are
 * live without a push channel, and a hidden tab costs the server nothing.
 * @param {AbortSignal} signal
 * @param {number} ms
 * @param {() => Promise<void>} fn
 */
export function every(signal, ms, fn) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  const tick = async () => {
    if (signal.aborted) return;
    // A failed refresh says why in the status line, and the next one tries again.
    if (!document.hidden) await fn().catch((err) => notify(String(err?.message ?? err), 'error'));
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  signal.addEventListener('abort', () => clearTimeout(timer));
  const wake = () => {
    if (!document.hidden && !signal.aborted) {
      clearTimeout(timer);
      void tick();
    }
  };
  document.addEventListener('visibilitychange', wake, { signal });
  return tick();
}
