/**
 * One exec on one VM, as an async iterable of contract events (`type`, `data`, `seq`, `ts`).
 *
 * Why an iterable: the HTTP layer pulls events at the pace of its client, and this class turns
 * that pace into backpressure on the VM (pause reading the agent channel when too many events
 * wait), so `while True: print(...)` to a stalled client keeps hostd's memory bounded.
 */
import { fail, HostdError } from '../errors.js';
import type { CellError, DisplayData, ExecSpec, Machine, OutputStream } from '../vm/machine.js';

export interface ExecEvent {
  /**
   * `display` only when the exec asked for rich outputs (docs/api.md, Rich outputs);
   * `execution_count`, `result` and `error` only for notebook cells (Notebook mode).
   */
  type: OutputStream | 'display' | 'execution_count' | 'result' | 'error' | 'exit';
  data: string | number | DisplayData | CellError;
  seq: number;
  ts: number;
  /** Only on an `exit` that hostd produced because the exec could not finish (VM died). */
  error?: string;
  /** Notebook cells: a stdout/stderr piece that does not end its line. */
  partial?: true;
}

/** Exit code hostd reports when the exec ended without the program's own exit code. */
export const EXECUTOR_FAILURE_EXIT = -1;
/** Exit code of an exec hostd interrupted because its output reached the cap. */
export const OUTPUT_LIMIT_EXIT = 125;

/** Events buffered before the VM's output is paused, and the level at which it resumes. */
const HIGH_WATER = 256;
const LOW_WATER = 32;
/**
 * After a cancel, how long hostd waits for the exit before it asks whether the guest is alive
 * (a ping), and how long it gives that ping.
 */
const CANCEL_PATIENCE_MS = 10_000;
const PING_TIMEOUT_MS = 10_000;

export interface ExecOptions extends ExecSpec {
  /** For error messages (an exec rejected for naming a context the sandbox lacks). */
  sandboxId?: string;
  timeoutMs?: number;
  /** Aborted when the HTTP client goes away: the exec is interrupted so the queue moves on. */
  signal?: AbortSignal;
  /** Bytes of output after which the exec is interrupted (SERVICE_MAX_EXEC_OUTPUT_BYTES). */
  maxOutputBytes?: number;
}

export class ExecRun implements AsyncIterable<ExecEvent> {
  private readonly events: ExecEvent[] = [];
  private seq = 0;
  private finished = false;
  private paused = false;
  private wake: (() => void) | null = null;
  private readonly execId: number;
  private timer: NodeJS.Timeout | undefined;
  private stuckTimer: NodeJS.Timeout | undefined;
  private pinging = false;
  private readonly onAbort = (): void => {
    this.discard();
    this.cancel('client');
  };
  private discarding = false;
  private cancelled = false;
  private outputBytes = 0;
  private readonly maxOutputBytes: number;
  private limitNotice: string | null = null;
  /** Why hostd itself interrupted the exec (not the client, not its timeout), told last. */
  private interruptNotice: string | null = null;
  private readonly signal: AbortSignal | undefined;
  /** Resolves once the exec is over on the VM side (not when the consumer has read it all). */
  readonly done: Promise<void>;
  private resolveDone!: () => void;
  /**
   * Resolves once the guest runs the exec (or it produced anything, or ended); rejects with
   * `context_not_found` when the guest refused it unrun. An exec naming a context waits for
   * it before it answers its client: that is a 404, not a stream.
   */
  readonly started: Promise<void>;
  private settleStarted!: (err?: HostdError) => void;

  constructor(
    private readonly vm: Machine,
    options: ExecOptions,
    /** Called when the VM stops answering even after a cancel; the owner destroys the VM. */
    private readonly onStuck: (reason: string) => void,
  ) {
    this.done = new Promise((r) => (this.resolveDone = r));
    this.started = new Promise<void>((resolve, reject) => {
      this.settleStarted = (err) => (err ? reject(err) : resolve());
    });
    this.started.catch(() => undefined); // read only by those who wait for it
    this.signal = options.signal;
    this.maxOutputBytes = options.maxOutputBytes ?? Infinity;
    const { language, code, env, cwd, display, context, notebook } = options;
    this.execId = vm.exec(
      { language, code, env, cwd, display, context, notebook },
      {
        onOutput: (stream, data, partial) => this.output(stream, data, partial),
        onDisplay: (data) => this.rich('display', data),
        onResult: (data) => this.rich('result', data),
        onError: (error) => this.rich('error', error),
        onStart: (count) => {
          this.settleStarted();
          if (notebook && count !== null) this.push({ type: 'execution_count', data: count });
        },
        onRejected: () =>
          this.settleStarted(fail('contextNotFound', options.sandboxId ?? '', context ?? '')),
        onExit: (code) => this.finish({ type: 'exit', data: code }),
        onLost: (reason) => this.fail(reason),
      },
    );
    if (options.timeoutMs !== undefined) {
      this.timer = setTimeout(() => this.cancel('timeout'), options.timeoutMs);
    }
    if (options.signal) {
      if (options.signal.aborted) this.cancel('client');
      else options.signal.addEventListener('abort', this.onAbort, { once: true });
    }
  }

  /** Ends the exec with an executor error (the sandbox was deleted, the VM died). */
  fail(reason: string): void {
    if (this.finished) return;
    this.push({ type: 'stderr', data: `hostd: executor error: ${reason}` });
    this.finish({ type: 'exit', data: EXECUTOR_FAILURE_EXIT, error: reason });
  }

  private cancel(reason: 'timeout' | 'client'): void {
    if (this.finished) return;
    this.vm.cancel(this.execId, reason);
    this.cancelled = true;
    this.armStuckTimer();
  }

  /**
   * After a cancel the agent kills bash at once and escalates to killing the REPL within 2 s of
   * its running; if no exit came CANCEL_PATIENCE_MS later, hostd pings the guest. One that
   * answers is slow, not wedged (a busy host, thousands of processes of user code wanting the
   * vCPU), and gets as long again, for as long as it answers: a slow host must not cost the
   * sandbox. One that does not answer is wedged, and its owner replaces it so that the
   * sandbox's queue does not stall forever. The clock only runs while hostd reads the guest:
   * while a slow client holds output paused, the exit cannot arrive, and that is not the
   * guest's fault.
   */
  private armStuckTimer(): void {
    if (!this.cancelled || this.finished || this.paused || this.stuckTimer || this.pinging) return;
    this.stuckTimer = setTimeout(() => {
      this.stuckTimer = undefined;
      void this.pingAfterCancel();
    }, CANCEL_PATIENCE_MS);
  }

  private async pingAfterCancel(): Promise<void> {
    if (this.finished) return;
    this.pinging = true;
    const answered = await this.vm.ping(PING_TIMEOUT_MS);
    this.pinging = false;
    if (this.finished) return;
    // A pause meanwhile stops the guest's answer too: the clock starts again on resume
    if (!answered && !this.paused) {
      const why = `the guest agent did not answer a cancel within ${CANCEL_PATIENCE_MS / 1000} s, nor a ping`;
      this.fail(why);
      this.onStuck(why);
      return;
    }
    this.armStuckTimer();
  }

  private pauseOutput(): void {
    this.paused = true;
    clearTimeout(this.stuckTimer);
    this.stuckTimer = undefined;
    this.vm.pauseOutput();
  }

  private resumeOutput(): void {
    this.paused = false;
    this.vm.resumeOutput();
    this.armStuckTimer();
  }

  /**
   * Nobody will read the rest (the client left): drop buffered and future output and keep
   * reading the VM, so the exit of the interrupted exec can arrive and free the queue.
   */
  discard(): void {
    this.discarding = true;
    this.events.length = 0;
    if (this.paused) this.resumeOutput();
  }

  /**
   * Interrupts the exec for a reason of hostd's own (it is shutting down): the client, if it is
   * still there, gets a stderr line saying so before the exit.
   */
  interrupt(why: string): void {
    if (this.finished || this.interruptNotice) return;
    this.interruptNotice = `hostd: execution interrupted: ${why}`;
    this.cancel('client');
  }

  /** Counts `bytes` of output against the cap; past it, drops the rest and interrupts the code. */
  private withinCap(bytes: number): boolean {
    if (this.limitNotice) return false;
    this.outputBytes += bytes;
    if (this.outputBytes <= this.maxOutputBytes) return true;
    this.limitNotice = `hostd: output limit of ${this.maxOutputBytes} bytes reached; execution interrupted`;
    this.cancel('client');
    return false;
  }

  private output(stream: OutputStream, data: string, partial?: boolean): void {
    if (this.withinCap(Buffer.byteLength(data) + 1)) {
      this.push(partial ? { type: stream, data, partial: true } : { type: stream, data });
    }
  }

  /** A rich output, result or cell error counts against the cap like text (its JSON size). */
  private rich(type: 'display' | 'result' | 'error', data: DisplayData | CellError): void {
    if (this.withinCap(JSON.stringify(data).length)) this.push({ type, data });
  }

  private push(event: Omit<ExecEvent, 'seq' | 'ts'>): void {
    this.settleStarted();
    if (this.finished) return;
    if (this.discarding) {
      this.seq++;
      return;
    }
    this.events.push({ ...event, seq: this.seq++, ts: Date.now() } as ExecEvent);
    if (!this.paused && this.events.length >= HIGH_WATER) this.pauseOutput();
    this.wake?.();
  }

  private finish(event: Omit<ExecEvent, 'seq' | 'ts'>): void {
    this.settleStarted();
    if (this.finished) return;
    if (this.limitNotice) {
      this.push({ type: 'stderr', data: this.limitNotice });
      // The guest ended it as a cancel; the cause was the cap, not a client.
      if (event.error === undefined) event = { ...event, data: OUTPUT_LIMIT_EXIT };
    }
    if (this.interruptNotice) this.push({ type: 'stderr', data: this.interruptNotice });
    this.push(event);
    this.finished = true;
    clearTimeout(this.timer);
    clearTimeout(this.stuckTimer);
    this.signal?.removeEventListener('abort', this.onAbort);
    if (this.paused) this.resumeOutput();
    this.resolveDone();
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    for (;;) {
      const event = this.events.shift();
      if (event) {
        if (this.paused && this.events.length <= LOW_WATER) this.resumeOutput();
        yield event;
        continue;
      }
      if (this.finished) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = null;
    }
  }
}
