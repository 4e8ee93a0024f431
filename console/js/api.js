// hostd's HTTP API (docs/api.md) as the console uses it: the key is asked for once, kept in
// this browser tab's session (sessionStorage: gone when the tab closes), and sent as
// `Authorization: Bearer` on every call. With auth off (loopback, no keys) no call is refused
// and the console never asks.

const KEY_ITEM = 'hostd.key';

/** An error answer of the API: `code` is stable (docs/api.md, Errors), `message` for people. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   */
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** @type {(() => Promise<string | null>) | null} */
let askForKey = null;

/**
 * Sets how a missing or refused key is asked for; it resolves with the key, or null when the
 * user gave up.
 * @param {() => Promise<string | null>} ask
 */
export function onKeyNeeded(ask) {
  askForKey = ask;
}

export function storedKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

/** @returns {Record<string, string>} */
function authHeader() {
  const key = storedKey();
  return key ? { authorization: `Bearer ${key}` } : {};
}

/** One key prompt at a time, however many calls were refused together. */
/** @type {Promise<boolean> | null} */
let asking = null;

async function renewKey() {
  if (!askForKey) return false;
  asking ??= askForKey().then((key) => {
    asking = null;
    if (key === null) return false;
    sessionStorage.setItem(KEY_ITEM, key);
    return true;
  });
  return asking;
}

/**
 * A call to the API; asks for the key when it is missing or refused (401) and tries again.
 * Non-2xx answers throw ApiError.
 * @param {string} method
 * @param {string} path
 * @param {{ json?: unknown, body?: BodyInit, type?: string, signal?: AbortSignal }} [opts]
 * @returns {Promise<Response>}
 */
export async function call(method, path, opts = {}) {
  for (;;) {
    /** @type {Record<string, string>} */
    const headers = authHeader();
    let body = opts.body;
    if (opts.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(opts.json);
    } else if (opts.type) {
      headers['content-type'] = opts.type;
    }
    const res = await fetch(path, { method, headers, body, signal: opts.signal });
    if (res.status === 401 && (await renewKey())) continue;
    if (!res.ok) throw await toError(res);
    return res;
  }
}

/** @param {Response} res */
async function toError(res) {
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    return new ApiError(res.status, body.code ?? 'unknown', body.error ?? text);
  } catch {
    return new ApiError(res.status, 'unknown', text || res.statusText);
  }
}

/**
 * @template T
 * @param {string} method
 * @param {string} path
 * @param {unknown} [json]
 * @returns {Promise<T>}
 */
export async function callJson(method, path, json) {
  const res = await call(method, path, json === undefined ? {} : { json });
  const text = await res.text();
  return /** @type {T} */ (text ? JSON.parse(text) : undefined);
}

/**
 * @typedef {{ type: 'stdout' | 'stderr', data: string, seq: number, ts: number }} OutputEvent
 * @typedef {{ type: 'display', data: Record<string, unknown>, seq: number, ts: number }} DisplayEvent
 * @typedef {{ type: 'exit', data: number, error?: string, seq: number, ts: number }} ExitEvent
 * @typedef {OutputEvent | DisplayEvent | ExitEvent} ExecEvent
 */

/**
 * Runs code in a sandbox and hands each NDJSON event to `onEvent` as it arrives: the response
 * body is read as a stream, so output appears while the code runs.
 * @param {string} id
 * @param {{ code: string, language: 'python' | 'bash', display?: boolean }} exec
 * @param {(event: ExecEvent) => void} onEvent
 * @param {AbortSignal} [signal] aborting it interrupts the code (hostd sees the client leave)
 */
export async function execStream(id, exec, onEvent, signal) {
  const res = await call('POST', `/v1/sandboxes/${id}/exec`, { json: exec, signal });
  if (!res.body) throw new ApiError(500, 'unknown', 'the exec answered with no body');
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += value;
    const lines = buffered.split('\n');
    buffered = lines.pop() ?? '';
    for (const line of lines) if (line.trim()) onEvent(JSON.parse(line));
  }
  if (buffered.trim()) onEvent(JSON.parse(buffered));
}

/**
 * @typedef {{
 *   id: string, state: 'ready' | 'paused' | 'failed', template: string, created_at: string,
 *   last_used_at: string, parent_id: string | null, snapshot_id: string | null, busy: boolean,
 *   queued: number, error: string | null,
 *   network: { allow_out: string[], bytes_out: number, bytes_in: number },
 *   memory_mib?: number | null, merged_from?: { id: string, merged_at: string }[],
 *   node?: string | null
 * }} Sandbox
 * @typedef {{
 *   snapshot_id: string, source_sandbox_id: string, template: string, size_bytes: number,
 *   created_at: string, sandboxes: number
 * }} Snapshot
 * @typedef {{
 *   name: string, default: boolean, state: 'building' | 'ready' | 'failed', error: string | null,
 *   memory_mib: number, vcpus: number, pool_size: number, disk_mib: number, description: string,
 *   preload: string[], debian_packages: string[], python_packages: string[],
 *   image_key: string | null, built_at: string | null
 * }} Template
 * @typedef {{
 *   name: string, path: string, type: 'file' | 'dir' | 'symlink' | 'other', size: number,
 *   mode: number, mtime_ms: number, target?: string
 * }} Entry
 */

/** @returns {Promise<Sandbox[]>} */
export async function listSandboxes() {
  return (await callJson('GET', '/v1/sandboxes')).sandboxes;
}

/** @returns {Promise<Template[]>} */
export async function listTemplates() {
  return (await callJson('GET', '/v1/templates')).templates;
}

/** @returns {Promise<Snapshot[]>} */
export async function listSnapshots() {
  return (await callJson('GET', '/v1/snapshots')).snapshots;
}

/**
 * Saves a response body as a file the user downloads (it came with the key, so a plain link
 * would not do).
 * @param {Response} res
 * @param {string} name
 */
export async function saveAs(res, name) {
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** @param {string} path */
export const q = (path) => encodeURIComponent(path);
