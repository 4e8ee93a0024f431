// Modal dialogs on the native <dialog> element: showModal() makes the rest of the page inert
// (focus stays in the dialog), Escape closes it, and focus goes back where it was.

import { h } from './dom.js';

/**
 * @typedef {{
 *   name: string, label: string, type?: string, value?: string, min?: number, max?: number,
 *   required?: boolean, options?: { value: string, label: string }[], hint?: string,
 *   autocomplete?: string
 * }} Field
 */

/**
 * Shows `dialog` modally; resolves with `result()` when its form is submitted, or null when it
 * is dismissed (Escape, Cancel).
 * @template T
 * @param {HTMLDialogElement} dialog
 * @param {() => T} result
 * @returns {Promise<T | null>}
 */
function open(dialog, result) {
  const back = document.activeElement;
  document.body.append(dialog);
  return new Promise((resolve) => {
    /** @type {T | null} */
    let value = null;
    const form = dialog.querySelector('form');
    form?.addEventListener('submit', (e) => {
      e.preventDefault();
      value = result();
      dialog.close();
    });
    dialog.addEventListener('keydown', (e) => trapTab(dialog, e));
    dialog.addEventListener('close', () => {
      dialog.remove();
      if (back instanceof HTMLElement && back.isConnected) back.focus();
      resolve(value);
    });
    dialog.showModal();
    const first = dialog.querySelector('[autofocus]');
    if (first instanceof HTMLElement) first.focus();
  });
}

/**
 * Tab from the last control goes to the first, Shift+Tab from the first to the last: focus
 * never leaves a modal dialog for the browser's own UI.
 * @param {HTMLDialogElement} dialog
 * @param {KeyboardEvent} e
 */
function trapTab(dialog, e) {
  if (e.key !== 'Tab') return;
  const focusable = [
    ...dialog.querySelectorAll('button, input, select, textarea, a[href], [tabindex="0"]'),
  ].filter((el) => el instanceof HTMLElement && !el.hasAttribute('disabled'));
  const first = focusable[0];
  const last = focusable[focusable.length - 1];
  if (!(first instanceof HTMLElement) || !(last instanceof HTMLElement)) return;
  if (e.shiftKey && document.activeElement === first) {
    e.preventDefault();
    last.focus();
  } else if (!e.shiftKey && document.activeElement === last) {
    e.preventDefault();
    first.focus();
  }
}

/**
 * @param {string} title
 * @param {HTMLElement[]} body
 * @param {string} action the submit button's label
 * @param {{ danger?: boolean, cancel?: boolean }} [opts]
 */
function dialogWith(title, body, action, opts = {}) {
  const titleId = `dialog-title-${Math.random().toString(36).slice(2)}`;
  return /** @type {HTMLDialogElement} */ (
    h(
      'dialog',
      { 'aria-labelledby': titleId },
      h(
        'form',
        { method: 'dialog' },
        h('h2', { id: titleId }, title),
        body,
        h(
          'div',
          { class: 'buttons' },
          // A plain button: Enter in a field submits with the form's first submit button,
          // which must be the action, not Cancel.
          opts.cancel === false
            ? null
            : h(
                'button',
                {
                  type: 'button',
                  autofocus: !!opts.danger,
                  onclick: (e) =>
                    /** @type {HTMLElement} */ (e.currentTarget).closest('dialog')?.close(),
                },
                'Cancel',
              ),
          h('button', { type: 'submit', class: opts.danger ? 'danger' : 'primary' }, action),
        ),
      ),
    )
  );
}

/**
 * Asks before an action that destroys state. Focus starts on Cancel.
 * @param {string} title
 * @param {string} message
 * @param {string} action
 * @returns {Promise<boolean>}
 */
export async function confirmAction(title, message, action) {
  const dialog = dialogWith(title, [h('p', {}, message)], action, { danger: true });
  return (await open(dialog, () => true)) === true;
}

/**
 * A form in a dialog; resolves with its values by field name, or null when dismissed. Enter in
 * any field submits it.
 * @param {string} title
 * @param {Field[]} fields
 * @param {string} action
 * @param {HTMLElement[]} [intro] shown above the fields
 * @returns {Promise<Record<string, string> | null>}
 */
export function formDialog(title, fields, action, intro = []) {
  const inputs = fields.map((f, i) => {
    const id = `field-${f.name}`;
    const hintId = f.hint ? `${id}-hint` : null;
    const common = {
      id,
      name: f.name,
      required: f.required ?? true,
      autofocus: i === 0,
      'aria-describedby': hintId,
    };
    const control = f.options
      ? h(
          'select',
          common,
          f.options.map((o) =>
            h('option', { value: o.value, selected: o.value === f.value }, o.label),
          ),
        )
      : h('input', {
          ...common,
          type: f.type ?? 'text',
          value: f.value ?? '',
          min: f.min,
          max: f.max,
          autocomplete: f.autocomplete ?? 'off',
        });
    return h(
      'p',
      { class: 'field' },
      h('label', { for: id }, f.label),
      control,
      hintId ? h('span', { id: hintId, class: 'hint' }, f.hint ?? '') : null,
    );
  });
  const dialog = dialogWith(title, [...intro, ...inputs], action);
  return open(dialog, () => {
    const data = new FormData(/** @type {HTMLFormElement} */ (dialog.querySelector('form')));
    return Object.fromEntries([...data.entries()].map(([k, v]) => [k, String(v)]));
  });
}

/**
 * Text to read (a log), in a dialog that only closes.
 * @param {string} title
 * @param {string} text
 */
export async function showText(title, text) {
  const pre = h('pre', { class: 'log', tabindex: 0 }, text || '(empty)');
  const dialog = dialogWith(title, [pre], 'Close', { cancel: false });
  dialog.classList.add('wide');
  await open(dialog, () => true);
}
