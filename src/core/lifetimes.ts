/**
 * Ends sandboxes whose lifetime is up (docs/api.md, Metadata and lifetime), on time: one timer,
 * armed for the earliest `expiresAt` of all running sandboxes and re-armed whenever one changes,
 * so that a sandbox given 5 s is gone within moments of its 5th second (E2B's SDK tests check
 * that), without a poll every few hundred milliseconds for the rest of hostd's life.
 */
import type { Sandbox } from './sandbox.js';

/** Node's timers take at most 2^31-1 ms; a later expiry re-arms when this one fires. */
const MAX_DELAY_MS = 2 ** 31 - 1;

export class LifetimeKeeper {
  private timer: NodeJS.Timeout | undefined;
  private armedFor: number | null = null;
  private stopped = false;
  /** Sandboxes being ended now: a re-arm while that waits must not end them twice. */
  private readonly ending = new Set<Sandbox>();

  constructor(
    private readonly sandboxes: () => Sandbox[],
    /** Deletes or pauses the sandbox; errors are the caller's to log. */
    private readonly expire: (sandbox: Sandbox) => Promise<void>,
    private readonly now: () => number = Date.now,
  ) {}

  /** Re-arms the timer for the earliest expiry; call after any `expiresAt` changes. */
  reschedule(): void {
    if (this.stopped) return;
    let earliest: number | null = null;
    for (const s of this.sandboxes()) {
      const at = s.expiresAt?.getTime();
      if (at === undefined || this.ending.has(s)) continue;
      if (earliest === null || at < earliest) earliest = at;
    }
    if (earliest === this.armedFor) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.armedFor = earliest;
    if (earliest === null) return;
    const delay = Math.min(Math.max(0, earliest - this.now()), MAX_DELAY_MS);
    this.timer = setTimeout(() => void this.sweep(), delay);
    this.timer.unref();
  }

  /** Ends every sandbox whose lifetime is up now; returns how many it started ending. */
  sweep(): number {
    this.armedFor = null;
    this.timer = undefined;
    const now = this.now();
    let n = 0;
    for (const s of this.sandboxes()) {
      const at = s.expiresAt?.getTime();
      if (at === undefined || at > now || this.ending.has(s)) continue;
      this.ending.add(s);
      n++;
      void this.expire(s)
        .catch(() => undefined)
        .finally(() => {
          this.ending.delete(s);
          this.reschedule();
        });
    }
    this.reschedule();
    return n;
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
