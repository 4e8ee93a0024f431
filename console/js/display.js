// Rich outputs of an exec (`display` events, docs/api.md "Rich outputs") as page elements.
// What a sandbox sends is untrusted: images go in as data: URLs of an <img> (which runs no
// script, SVG included), a pandas table is rebuilt cell by cell as text, and any other HTML
// renders in a sandboxed frame with no script and an opaque origin, never in this page.

import { h } from './dom.js';

/**
 * @param {Record<string, unknown>} bundle a MIME bundle
 * @returns {HTMLElement}
 */
export function renderDisplay(bundle) {
  const text = typeof bundle['text/plain'] === 'string' ? bundle['text/plain'] : '';
  for (const type of ['image/png', 'image/jpeg']) {
    const data = bundle[type];
    if (typeof data === 'string') {
      return figure(
        h('img', { src: `data:${type};base64,${data.replace(/\s/g, '')}`, alt: text || 'a chart' }),
      );
    }
  }
  const svg = bundle['image/svg+xml'];
  if (typeof svg === 'string') {
    const src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`;
    return figure(h('img', { src, alt: text || 'an image' }));
  }
  const html = bundle['text/html'];
  if (typeof html === 'string') return tableFrom(html) ?? framed(html, text);
  if ('application/json' in bundle) {
    return h(
      'pre',
      { class: 'out display-json' },
      JSON.stringify(bundle['application/json'], null, 2),
    );
  }
  for (const type of ['text/markdown', 'text/latex']) {
    const value = bundle[type];
    if (typeof value === 'string') return h('pre', { class: 'out' }, value);
  }
  return h('pre', { class: 'out' }, text);
}

/** @param {HTMLElement} content */
function figure(content) {
  return h('figure', { class: 'display' }, content);
}

/**
 * A DataFrame's (or any) first <table>, rebuilt from its cells' text: the console's own styles,
 * nothing of the source's markup, attributes or scripts. Null when the HTML holds no table.
 * @param {string} html
 * @returns {HTMLElement | null}
 */
export function tableFrom(html) {
  // DOMParser builds an inert document: no script runs, no image loads. Styles are dropped
  // first only so that the CSP does not report pandas' inline ones: none would apply anyway.
  const unstyled = html.replace(/<style[\s\S]*?<\/style>/gi, '').replace(/\sstyle="[^"]*"/gi, '');
  const doc = new DOMParser().parseFromString(unstyled, 'text/html');
  const source = doc.querySelector('table');
  if (!source) return null;
  const rows = [...source.querySelectorAll('tr')].slice(0, 1000);
  /** @param {Element} row */
  const cells = (row) =>
    [...row.children]
      .filter((c) => c.tagName === 'TH' || c.tagName === 'TD')
      .map((c) => {
        const head = c.tagName === 'TH';
        const span = Number(c.getAttribute('colspan') ?? '1');
        return h(
          head ? 'th' : 'td',
          {
            scope: head ? (row.parentElement?.tagName === 'THEAD' ? 'col' : 'row') : null,
            colspan: span > 1 && span <= 1000 ? span : null,
          },
          c.textContent ?? '',
        );
      });
  const head = rows.filter((r) => r.parentElement?.tagName === 'THEAD');
  const body = rows.filter((r) => r.parentElement?.tagName !== 'THEAD');
  return h(
    'div',
    { class: 'table-wrap display', role: 'region', 'aria-label': 'table output', tabindex: 0 },
    h(
      'table',
      { class: 'dataframe' },
      head.length
        ? h(
            'thead',
            {},
            head.map((r) => h('tr', {}, cells(r))),
          )
        : null,
      h(
        'tbody',
        {},
        body.map((r) => h('tr', {}, cells(r))),
      ),
    ),
  );
}

/**
 * Other HTML in a frame sandboxed without `allow-scripts` or `allow-same-origin`: it can show
 * markup but run nothing and reach nothing of the console.
 * @param {string} html
 * @param {string} text its plain-text form, the frame's title
 */
function framed(html, text) {
  return h('iframe', {
    class: 'display display-html',
    sandbox: '',
    referrerpolicy: 'no-referrer',
    srcdoc: html,
    title: text ? `HTML output: ${text.slice(0, 80)}` : 'HTML output',
  });
}
