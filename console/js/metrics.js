// Prometheus' text exposition format, as GET /metrics serves it (prom-client), read into
// samples: enough of the format for the host view, no client library.

/** @typedef {{ name: string, labels: Record<string, string>, value: number }} Sample */

/**
 * Every sample of the text, comments and blank lines skipped.
 * @example parseMetrics('hostd_pool_ready{template="python"} 2\n')
 *   // [{ name: 'hostd_pool_ready', labels: { template: 'python' }, value: 2 }]
 * @param {string} text
 * @returns {Sample[]}
 */
export function parseMetrics(text) {
  /** @type {Sample[]} */
  const samples = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    samples.push({
      name: m[1] ?? '',
      labels: parseLabels(m[3] ?? ''),
      value: parseValue(m[4] ?? ''),
    });
  }
  return samples;
}

/** @param {string} s */
function parseValue(s) {
  if (s === '+Inf') return Infinity;
  if (s === '-Inf') return -Infinity;
  return Number(s);
}

/**
 * `a="x",b="y \"quoted\""` with the format's escapes (\\, \", \n).
 * @param {string} s
 * @returns {Record<string, string>}
 */
function parseLabels(s) {
  /** @type {Record<string, string>} */
  const labels = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const m of s.matchAll(re)) {
    labels[m[1] ?? ''] = (m[2] ?? '').replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
  }
  return labels;
}

/**
 * The value of the first sample named `name` whose labels include `labels`; null if none.
 * @param {Sample[]} samples
 * @param {string} name
 * @param {Record<string, string>} [labels]
 */
export function metric(samples, name, labels = {}) {
  const found = samples.find(
    (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
  );
  return found ? found.value : null;
}
