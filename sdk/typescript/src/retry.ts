/**
 * When to send a request again. Only `429` (a cap: sandboxes alive, requests queued) and `503`
 * (short of memory or disk, a template still building, shutting down) can succeed later
 * without the caller changing anything, so only those are retried: after the server's
 * `Retry-After`, else after an exponential backoff. Every other error is the caller's to see.
 */

/** A `Retry-After` longer than this is not waited for: the error goes to the caller. */
export const MAX_RETRY_AFTER_MS = 30_000;
/** The first backoff when the server gave no `Retry-After`; it doubles with each retry. */
export const FIRST_BACKOFF_MS = 500;
const MAX_BACKOFF_MS = 8_000;

/**
 * Milliseconds to wait before retry number `attempt + 1`, or undefined to give up. `random` is a
 * parameter for tests; the jitter (up to a quarter of the backoff) keeps clients that failed
 * together from retrying together.
 */
export function retryDelayMs(
  status: number,
  retryAfterMs: number | undefined,
  attempt: number,
  maxRetries: number,
  random: () => number = Math.random,
): number | undefined {
  if (status !== 429 && status !== 503) return undefined;
  if (attempt >= maxRetries) return undefined;
  if (retryAfterMs !== undefined) {
    return retryAfterMs <= MAX_RETRY_AFTER_MS ? retryAfterMs : undefined;
  }
  const backoff = Math.min(FIRST_BACKOFF_MS * 2 ** attempt, MAX_BACKOFF_MS);
  return Math.round(backoff * (1 + random() / 4));
}

/** `Retry-After` in milliseconds: delay-seconds or an HTTP date; undefined when absent or bad. */
export function parseRetryAfter(
  value: string | undefined,
  now: number = Date.now(),
): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
