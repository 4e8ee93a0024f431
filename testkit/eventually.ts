/**
 * Waiting on a condition instead of sleeping: tests and the benchmark never order events by
 * time, they wait until what they need is true (a pool refilled, a process gone, a sandbox
 * busy), and fail with a clear message when it never becomes true.
 */

/**
 * Resolves with the first truthy value `probe` returns, polling every `everyMs`; rejects after
 * `timeoutMs` with `what` in the message.
 */
export async function eventually<T>(
  what: string,
  probe: () => T | Promise<T>,
  { timeoutMs = 30_000, everyMs = 10 }: { timeoutMs?: number; everyMs?: number } = {},
): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
