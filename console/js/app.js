// The console's shell: the key prompt, the status line, and a router from the URL's #fragment
// to a view. Each view gets a fresh AbortSignal, aborted when the user goes elsewhere, which
// stops its refresh loop and any exec it streams.

import { forgetKey, onKeyNeeded, storedKey } from './api.js';
import { formDialog } from './dialogs.js';
import { h } from './dom.js';
import { notify } from './status.js';
import { renderHost } from './views/host.js';
import { renderLineage } from './views/lineage.js';
import { renderSandbox } from './views/sandbox.js';
import { renderSandboxes } from './views/sandboxes.js';
import { renderSnapshots } from './views/snapshots.js';
import { renderTemplates } from './views/templates.js';

/**
 * @typedef {{ signal: AbortSignal, params: string[] }} ViewContext
 * @typedef {(main: HTMLElement, ctx: ViewContext) => void | Promise<void>} View
 */

/** @type {Record<string, View>} */
const VIEWS = {
  sandboxes: renderSandboxes,
  sandbox: renderSandbox,
  lineage: renderLineage,
  snapshots: renderSnapshots,
  templates: renderTemplates,
  host: renderHost,
};

const main = /** @type {HTMLElement} */ (document.getElementById('main'));
const forget = /** @type {HTMLButtonElement} */ (document.getElementById('forget-key'));

onKeyNeeded(async () => {
  const values = await formDialog(
    'API key',
    [
      {
        name: 'key',
        label: 'API key',
        type: 'password',
        autocomplete: 'current-password',
        hint: 'One of the keys in SERVICE_API_KEYS. It is kept in this tab only, until it closes.',
      },
    ],
    'Use key',
    [h('p', {}, 'This hostd requires a key.')],
  );
  const key = values?.key?.trim();
  if (!key) {
    notify('No key given: the console cannot reach the API.', 'error');
    return null;
  }
  forget.hidden = false;
  return key;
});

// The skip link moves focus to the view without touching the #fragment, which is the route.
document.querySelector('.skip')?.addEventListener('click', (e) => {
  e.preventDefault();
  main.focus();
});

forget.hidden = storedKey() === null;
forget.addEventListener('click', () => {
  forgetKey();
  forget.hidden = true;
  notify('The key is forgotten; the next call asks for it again.');
});

/** @type {AbortController | null} */
let current = null;

async function route() {
  const [name = 'sandboxes', ...params] = location.hash.replace(/^#\/?/, '').split('/');
  const view = VIEWS[name] ?? renderSandboxes;
  current?.abort();
  current = new AbortController();
  for (const link of document.querySelectorAll('nav a')) {
    const target = link.getAttribute('href')?.slice(2);
    const here = target === name || (target === 'sandboxes' && name === 'sandbox');
    if (here) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  main.replaceChildren();
  try {
    await view(main, { signal: current.signal, params: params.map(decodeURIComponent) });
  } catch (err) {
    main.append(
      h('p', { class: 'error', role: 'alert' }, String(/** @type {Error} */ (err).message ?? err)),
    );
  }
  // Keyboard and screen-reader users start at the new view's heading.
  const heading = main.querySelector('h1');
  if (heading instanceof HTMLElement && document.activeElement !== heading) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}

window.addEventListener('hashchange', () => void route());
void route();
