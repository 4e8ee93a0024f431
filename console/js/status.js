// The page's status line: what an action did, or why it failed. It is a live region, so
// screen readers announce it; errors also say "Error:" in words, not only in colour.

/**
 * @param {string} message
 * @param {'ok' | 'error'} [kind]
 */
export function notify(message, kind = 'ok') {
  const status = document.getElementById('status');
  if (!status) return;
  status.textContent = kind === 'error' ? `Error: ${message}` : message;
  status.className = `status status-${kind}`;
}

/**
 * Runs an action, saying what it did when it worked and why not when it failed.
 * @template T
 * @param {() => Promise<T>} action
 * @param {(result: T) => string} done
 * @returns {Promise<T | null>}
 */
export async function attempt(action, done) {
  try {
    const result = await action();
    notify(done(result));
    return result;
  } catch (err) {
    notify(err instanceof Error ? err.message : String(err), 'error');
    return null;
  }
}
