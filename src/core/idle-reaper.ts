/**
 * Deletes sandboxes nobody has used for `idleTimeoutS`: an agent that forgets a sandbox must not
 * hold a VM forever. A sandbox that is running something is never idle.
 */
import type { Sandbox } from './sandbox.js';

export class IdleReaper {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly idleTimeoutS: number,
    private readonly sandboxes: () => Sandbox[],
    private readonly reap: (sandbox: Sandbox) => Promise<void>,
  ) {}

  /** Checks every half timeout (at most every 30 s); a 0 timeout never reaps. */
  start(): void {
    if (this.idleTimeoutS <= 0) return;
    const every = Math.min(30_000, this.idleTimeoutS * 500);
    this.timer = setInterval(() => void this.sweep(), every);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Reaps every sandbox idle since before `now - timeout`; returns how many. */
  async sweep(now = Date.now()): Promise<number> {
    const cutoff = now - this.idleTimeoutS * 1000;
    let reaped = 0;
    for (const s of this.sandboxes()) {
      if (s.lastUsedAt < cutoff && !s.queue.running) {
        await this.reap(s).catch(() => undefined);
        reaped++;
      }
    }
    return reaped;
  }
}
