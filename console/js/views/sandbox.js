// One sandbox: what it is (live), its actions, a REPL whose output streams in as the code
// runs (rich outputs rendered), its files, and its network rules and counters.

import { sandboxButtons } from '../actions.js';
import { ApiError, call, callJson, execStream, listSandboxes, q, saveAs } from '../api.js';
import { confirmAction, formDialog, showText } from '../dialogs.js';
import { renderDisplay } from '../display.js';
import { age, bytes, every, h, shortId, swap, table } from '../dom.js';
import { attempt, notify } from '../status.js';
import { memory, sandboxState } from './sandboxes.js';

/** @typedef {import('../api.js').Sandbox} Sandbox */

/**
 * @param {HTMLElement} main
 * @param {import('../app.js').ViewContext} ctx
 */
export async function renderSandbox(main, { signal, params }) {
  const id = params[0] ?? '';
  const info = h('div', { class: 'live' });
  const network = h('div', { class: 'live' });
  const browser = files(id);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/sandboxes' }, 'Sandboxes'), ' / '),
    h('h1', {}, 'Sandbox ', h('code', { class: 'id' }, id)),
    info,
    repl(id, signal),
    browser.section,
    h(
      'section',
      { 'aria-labelledby': 'network-title' },
      h('h2', { id: 'network-title' }, 'Network'),
      network,
    ),
  );

  let gone = false;
  let listed = false;
  async function load() {
    if (gone) return;
    /** @type {Sandbox} */
    let s;
    try {
      s = await callJson('GET', `/v1/sandboxes/${id}`);
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 410)) {
        gone = true;
        swap(info, await goneNote(id, err));
        return;
      }
      throw err;
    }
    const sandboxes = await listSandboxes();
    const parentAlive = !!s.parent_id && sandboxes.some((o) => o.id === s.parent_id);
    swap(info, details(s, parentAlive), actions(s, parentAlive, load));
    swap(network, networkOf(s));
    if (!listed) {
      listed = true;
      // Listing a paused sandbox's files would resume it: looking must not change anything.
      if (s.state === 'ready') void browser.show();
      else
        browser.note(
          `The sandbox is ${s.state}: "Open" lists its files (and resumes a paused one).`,
        );
    }
  }
  await every(signal, 2000, load);
}

/**
 * @param {string} id
 * @param {ApiError} err
 */
async function goneNote(id, err) {
  if (err.status === 410) return h('p', { class: 'error', role: 'alert' }, `Lost: ${err.message}`);
  const into = (await listSandboxes()).find((s) => (s.merged_from ?? []).some((m) => m.id === id));
  return h(
    'p',
    { class: 'empty', role: 'alert' },
    into
      ? [
          'This sandbox was merged into ',
          h('a', { href: `#/sandbox/${into.id}` }, into.id),
          ', which runs its state now.',
        ]
      : 'This sandbox no longer exists: it was deleted.',
  );
}

/**
 * @param {Sandbox} s
 * @param {boolean} parentAlive
 */
function details(s, parentAlive) {
  /** @type {[string, (string | Node)[] | string | Node][]} */
  const items = [
    ['State', [sandboxState(s), s.error ? ` — ${s.error}` : '']],
    ['Template', s.template],
    ['Created', `${age(s.created_at)} ago`],
    ['Last used', `${age(s.last_used_at)} ago`],
    ['Memory', memory(s.memory_mib)],
  ];
  if (s.node !== undefined) items.push(['Node', s.node ?? '—']);
  if (s.parent_id) {
    items.push([
      'Forked from',
      parentAlive
        ? h('a', { href: `#/sandbox/${s.parent_id}` }, s.parent_id)
        : `${s.parent_id} (gone)`,
    ]);
  }
  if (s.snapshot_id) items.push(['From snapshot', s.snapshot_id]);
  const merged = s.merged_from ?? [];
  if (merged.length) {
    items.push([
      'Merged in',
      merged.map((m) => `${shortId(m.id)} (${age(m.merged_at)} ago)`).join(', '),
    ]);
  }
  return h(
    'dl',
    { class: 'facts' },
    items.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
  );
}

/**
 * @param {Sandbox} s
 * @param {boolean} parentAlive
 * @param {() => Promise<void>} reload
 */
function actions(s, parentAlive, reload) {
  const buttons = sandboxButtons(s, () => void reload(), { parentAlive });
  buttons.append(
    h(
      'button',
      {
        type: 'button',
        class: 'small',
        'data-key': 'logs',
        onclick: async () => {
          const res = await call('GET', `/v1/sandboxes/${s.id}/logs`).catch(
            (/** @type {Error} */ e) => {
              notify(e.message, 'error');
              return null;
            },
          );
          if (res) await showText(`VM log of ${shortId(s.id)}`, await res.text());
        },
      },
      'VM log',
    ),
  );
  return h('div', { class: 'toolbar', role: 'group', 'aria-label': 'Sandbox actions' }, buttons);
}

/** @param {Sandbox} s */
function networkOf(s) {
  const { allow_out: rules, bytes_out: out, bytes_in: inward } = s.network;
  return [
    rules.length
      ? h(
          'ul',
          { class: 'rules', 'aria-label': 'Outbound rules' },
          rules.map((r) => h('li', {}, h('code', {}, r))),
        )
      : h('p', {}, 'No network: created without outbound rules.'),
    h(
      'dl',
      { class: 'facts' },
      h('dt', {}, 'Sent'),
      h('dd', { 'data-testid': 'bytes-out' }, bytes(out)),
      h('dt', {}, 'Received'),
      h('dd', { 'data-testid': 'bytes-in' }, bytes(inward)),
    ),
  ];
}

/**
 * A notebook-like REPL: each run appends a cell with its code and its output as it streams.
 * Shift+Enter or Ctrl+Enter runs, as in notebooks; Stop interrupts (the exec sees its client
 * leave and ends with code 130).
 * @param {string} id
 * @param {AbortSignal} viewSignal
 */
function repl(id, viewSignal) {
  const log = h('div', {
    class: 'cells',
    role: 'log',
    'aria-label': 'Output',
    'aria-live': 'polite',
  });
  const code = /** @type {HTMLTextAreaElement} */ (
    h('textarea', {
      id: 'code',
      name: 'code',
      rows: 5,
      spellcheck: 'false',
      'aria-describedby': 'code-hint',
    })
  );
  const language = /** @type {HTMLSelectElement} */ (
    h(
      'select',
      { id: 'language', name: 'language' },
      h('option', { value: 'python' }, 'Python'),
      h('option', { value: 'bash' }, 'bash'),
    )
  );
  const rich = /** @type {HTMLInputElement} */ (
    h('input', { type: 'checkbox', id: 'rich', checked: true })
  );
  const run = /** @type {HTMLButtonElement} */ (
    h('button', { type: 'submit', class: 'primary' }, 'Run')
  );
  const stop = /** @type {HTMLButtonElement} */ (
    h('button', { type: 'button', disabled: true }, 'Stop')
  );
  /** @type {AbortController | null} */
  let running = null;
  stop.addEventListener('click', () => running?.abort());
  viewSignal.addEventListener('abort', () => running?.abort());
  code.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.shiftKey || e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });

  const form = /** @type {HTMLFormElement} */ (
    h(
      'form',
      {
        class: 'repl',
        onsubmit: async (e) => {
          e.preventDefault();
          if (running || !code.value.trim()) return;
          running = new AbortController();
          run.disabled = true;
          stop.disabled = false;
          try {
            await runCell(
              id,
              code.value,
              language.value === 'bash' ? 'bash' : 'python',
              rich.checked,
              log,
              running.signal,
            );
          } finally {
            running = null;
            run.disabled = false;
            stop.disabled = true;
          }
        },
      },
      h('label', { for: 'code' }, 'Code'),
      code,
      h(
        'span',
        { id: 'code-hint', class: 'hint' },
        'Shift+Enter or Ctrl+Enter runs. Python state persists between runs.',
      ),
      h(
        'div',
        { class: 'toolbar' },
        h('label', { for: 'language' }, 'Language '),
        language,
        h('label', { class: 'check' }, rich, ' Rich output (charts, tables)'),
        run,
        stop,
      ),
    )
  );
  return h(
    'section',
    { 'aria-labelledby': 'repl-title' },
    h('h2', { id: 'repl-title' }, 'REPL'),
    form,
    log,
  );
}

/**
 * @param {string} id
 * @param {string} source
 * @param {'python' | 'bash'} language
 * @param {boolean} display
 * @param {HTMLElement} log
 * @param {AbortSignal} signal
 */
async function runCell(id, source, language, display, log, signal) {
  const out = h('div', { class: 'cell-out' });
  const status = h('p', { class: 'exit' }, 'running…');
  log.append(
    h(
      'div',
      { class: 'cell' },
      h('pre', { class: 'in', 'aria-label': 'Code run' }, source),
      out,
      status,
    ),
  );
  /** @type {HTMLElement | null} */
  let block = null;
  let stream = '';
  try {
    await execStream(
      id,
      { code: source, language, ...(display && language === 'python' ? { display: true } : {}) },
      (event) => {
        if (event.type === 'stdout' || event.type === 'stderr') {
          if (!block || stream !== event.type) {
            stream = event.type;
            block = h('pre', { class: `out ${event.type}` });
            out.append(
              event.type === 'stderr' ? h('div', { class: 'stream-label' }, 'stderr') : '',
              block,
            );
          }
          block.append(`${event.data}\n`);
        } else if (event.type === 'display') {
          block = null;
          out.append(renderDisplay(event.data));
        } else if (event.type === 'exit') {
          const ok = event.data === 0;
          status.textContent = event.error
            ? `✖ hostd could not finish: ${event.error}`
            : `${ok ? '✔' : '✖'} exit ${event.data}`;
          status.className = `exit ${ok ? 'exit-ok' : 'exit-bad'}`;
        }
      },
      signal,
    );
  } catch (err) {
    const stopped = signal.aborted;
    status.textContent = stopped ? '✖ stopped' : `✖ ${/** @type {Error} */ (err).message}`;
    status.className = 'exit exit-bad';
  }
}

/**
 * A file browser: list a directory, go into folders, download and delete files, upload into
 * the folder shown, make folders.
 * @param {string} id
 */
function files(id) {
  let dir = '/root';
  const listing = h('div', {});
  const pathInput = /** @type {HTMLInputElement} */ (
    h('input', { id: 'files-path', name: 'path', value: dir, autocomplete: 'off' })
  );
  const upload = /** @type {HTMLInputElement} */ (
    h('input', { id: 'upload', type: 'file', multiple: true })
  );

  /** @param {string} [path] */
  async function show(path = dir) {
    try {
      const res = await callJson('GET', `/v1/sandboxes/${id}/files/list?path=${q(path)}`);
      dir = path;
      pathInput.value = path;
      /** @type {import('../api.js').Entry[]} */
      const entries = /** @type {{ entries: import('../api.js').Entry[] }} */ (res).entries;
      const up = path === '/' ? null : path.replace(/\/[^/]+\/?$/, '') || '/';
      const rows = entries.map((e) =>
        h(
          'tr',
          {},
          h(
            'th',
            { scope: 'row' },
            e.type === 'dir'
              ? h(
                  'button',
                  {
                    type: 'button',
                    class: 'link',
                    onclick: () => void show(e.path),
                    'data-key': `dir-${e.path}`,
                  },
                  `${e.name}/`,
                )
              : e.type === 'symlink'
                ? `${e.name} → ${e.target ?? ''}`
                : e.name,
          ),
          h('td', {}, e.type),
          h('td', { class: 'num' }, e.type === 'file' ? bytes(e.size) : ''),
          h(
            'td',
            { title: new Date(e.mtime_ms).toISOString() },
            `${age(new Date(e.mtime_ms).toISOString())} ago`,
          ),
          h(
            'td',
            {},
            h(
              'span',
              { class: 'actions' },
              e.type === 'file'
                ? h(
                    'button',
                    {
                      type: 'button',
                      class: 'small',
                      'aria-label': `Download ${e.name}`,
                      onclick: () => void download(e.path, e.name),
                    },
                    'Download',
                  )
                : null,
              h(
                'button',
                {
                  type: 'button',
                  class: 'small danger',
                  'aria-label': `Delete ${e.name}`,
                  onclick: () => void remove(e),
                },
                'Delete',
              ),
            ),
          ),
        ),
      );
      swap(
        listing,
        up
          ? h(
              'button',
              { type: 'button', class: 'small', onclick: () => void show(up) },
              '↑ Up to ',
              up,
            )
          : null,
        table(
          `Files in ${path}`,
          ['Name', 'Type', 'Size', 'Modified', 'Actions'],
          rows,
          `${path} is empty.`,
        ),
      );
    } catch (err) {
      notify(/** @type {Error} */ (err).message, 'error');
    }
  }

  /**
   * @param {string} path
   * @param {string} name
   */
  async function download(path, name) {
    await attempt(
      async () => saveAs(await call('GET', `/v1/sandboxes/${id}/files?path=${q(path)}`), name),
      () => `Downloaded ${path}.`,
    );
  }

  /** @param {import('../api.js').Entry} e */
  async function remove(e) {
    const dirNote = e.type === 'dir' ? ' and everything in it' : '';
    if (
      !(await confirmAction(
        'Delete file?',
        `${e.path}${dirNote} is deleted from the sandbox.`,
        'Delete',
      ))
    )
      return;
    const recursive = e.type === 'dir' ? '&recursive=1' : '';
    await attempt(
      () => call('DELETE', `/v1/sandboxes/${id}/files?path=${q(e.path)}${recursive}`),
      () => `Deleted ${e.path}.`,
    );
    await show(dir);
  }

  async function uploadChosen() {
    for (const file of upload.files ?? []) {
      const path = `${dir.replace(/\/$/, '')}/${file.name}`;
      await attempt(
        () =>
          call('PUT', `/v1/sandboxes/${id}/files?path=${q(path)}`, {
            body: file,
            type: 'application/octet-stream',
          }),
        () => `Uploaded ${path} (${bytes(file.size)}).`,
      );
    }
    upload.value = '';
    await show(dir);
  }

  async function newFolder() {
    const values = await formDialog(
      'New folder',
      [{ name: 'name', label: 'Folder name' }],
      'Create',
    );
    if (!values?.name) return;
    const path = `${dir.replace(/\/$/, '')}/${values.name}`;
    await attempt(
      () => call('POST', `/v1/sandboxes/${id}/files/mkdir?path=${q(path)}`),
      () => `Created ${path}.`,
    );
    await show(dir);
  }

  const section = h(
    'section',
    { 'aria-labelledby': 'files-title' },
    h('h2', { id: 'files-title' }, 'Files'),
    h(
      'form',
      {
        class: 'toolbar',
        onsubmit: (e) => {
          e.preventDefault();
          void show(pathInput.value.trim() || '/');
        },
      },
      h('label', { for: 'files-path' }, 'Folder'),
      pathInput,
      h('button', { type: 'submit' }, 'Open'),
      h('button', { type: 'button', onclick: () => void show(dir) }, 'Refresh'),
      h('button', { type: 'button', onclick: () => void newFolder() }, 'New folder'),
    ),
    h(
      'p',
      { class: 'toolbar' },
      h('label', { for: 'upload' }, 'Upload into this folder'),
      upload,
      h('button', { type: 'button', onclick: () => void uploadChosen() }, 'Upload'),
    ),
    listing,
  );
  /** @param {string} text */
  const note = (text) => swap(listing, h('p', { class: 'empty' }, text));
  return { section, show, note };
}
