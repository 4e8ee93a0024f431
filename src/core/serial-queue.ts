/**
 * A FIFO mutex: execs on one sandbox run one at a time in arrival order (docs/api.md), and fork and
 * merge wait their turn in the same line. Waiters can leave (client gone) and the whole queue
 * can be closed (sandbox deleted or merged away), which rejects every waiter.
 */
import { fail, type HostdError } from '../errors.js';
import { once } from './once.js';

export type Release = () => void;

interface Waiter {
  grant: (release: Release) => void;
  reject: (err: Error) => void;
}

export class SerialQueue {
  private busy = false;
  private readonly waiters: Waiter[] = [];
  private closedWith: HostdError | null = null;

  constructor(private readonly maxWaiting: number) {}

  /** Number of callers waiting (not counting the one holding the lock). */
  get waiting(): number {
    return this.waiters.length;
  }

  get running(): boolean {
    return this.busy;
  }

  /**
   * Resolves with a release function once it is the caller's turn. Rejects when the signal
   * aborts first, when the queue is closed, or when too many callers already wait.
   */
  acquire(signal?: AbortSignal): Promise<Release> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    if (signal?.aborted) return Promise.reject(fail('requestAborted', 'before its turn'));
    if (!this.busy) {
      this.busy = true;
      return Promise.resolve(this.releaser());
    }
    if (this.waiters.length >= this.maxWaiting) {
      return Promise.reject(fail('queueFull', this.maxWaiting));
    }
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        grant: (release) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(release);
        },
        reject: (err) => {
          signal?.removeEventListener('abort', onAbort);
          reject(err);
        },
      };
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(fail('requestAborted', 'while its request was queued'));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** Rejects the callers waiting now with `err`; later callers queue as usual. */
  rejectWaiting(err: HostdError): void {
    for (const w of this.waiters.splice(0)) w.reject(err);
  }

  /** Rejects all current and future waiters with `err`; the current holder finishes normally. */
  close(err: HostdError): void {
    this.closedWith = err;
    for (const w of this.waiters.splice(0)) w.reject(err);
  }

  private releaser(): Release {
    return once(() => {
      const next = this.waiters.shift();
      if (next) next.grant(this.releaser());
      else this.busy = false;
    });
  }
}
