/**
 * Host side of the guest agent protocol (guest/PROTOCOL.md): newline-delimited JSON over the
 * two unix sockets that QEMU bridges to the guest's virtio-serial ports: `hostd.agent` (the
 * agent: hello, ping, cancel, bash) and `hostd.repl` (the Python REPL worker, which answers
 * Python execs itself, sparing each a hop through the agent process: docs/architecture.md,
 * "Measured choices in the code").
 * Hand-written because the protocol is ours.
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import type {
  CancelReason,
  ContextAnswer,
  ContextInfo,
  ContextRequest,
  DisplayData,
  ExecSink,
  ExecSpec,
} from '../machine.js';
import { parseQuietRelay, type QuietRelay } from './net-channel.js';
import { connectWithRetry, LineReader, parseJsonObject } from './unix-socket.js';

/**
 * The guest never sends a line over 1 MiB, or 16 MiB for a display (PROTOCOL.md); anything
 * longer is garbage.
 */
const MAX_GUEST_LINE = 16 * 1024 * 1024 + 1024;

/** The agent did not answer, or the connection broke. */
export class AgentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AgentError';
  }
}

interface GuestMessage {
  op?: string;
  id?: number;
  nonce?: string;
  stream?: string;
  data?: unknown;
  code?: number;
  upto?: number;
  message?: string;
  error?: unknown;
  zeroed_bytes?: unknown;
  net?: unknown;
  prepare_pause?: unknown;
  partial?: unknown;
  name?: unknown;
  value?: unknown;
  traceback?: unknown;
  execution_count?: unknown;
  rejected?: unknown;
  contexts?: unknown;
  context?: unknown;
}

/** A sink of the REPL port: an exec's, or a context request's (which gets one answer). */
interface ReplSink extends ExecSink {
  onContext?(answer: ContextAnswer): void;
}

/** A context as the guest describes it, or null when it is malformed. */
function contextInfo(v: unknown): ContextInfo | null {
  if (typeof v !== 'object' || v === null) return null;
  const { id, cwd, execution_count: count } = v as Record<string, unknown>;
  if (typeof id !== 'string' || typeof cwd !== 'string' || !Number.isInteger(count)) return null;
  return { id, cwd, execution_count: count as number };
}

/** The worker's answer to a context request (guest/PROTOCOL.md), checked field by field. */
function contextAnswer(msg: GuestMessage): ContextAnswer {
  if (msg.error !== undefined) {
    return { error: { code: String(msg.error), message: String(msg.message ?? '') } };
  }
  if (Array.isArray(msg.contexts)) {
    const contexts = msg.contexts.map(contextInfo);
    if (contexts.every((c) => c !== null)) return { contexts: contexts as ContextInfo[] };
  } else if (msg.context !== undefined) {
    const context = contextInfo(msg.context);
    if (context) return { context };
  } else {
    return {};
  }
  return { error: { code: 'bad_answer', message: 'the REPL sent a malformed context answer' } };
}

const text = (v: unknown): string => (typeof v === 'string' ? v : '');

/** A MIME bundle whose every type is a string key (values are checked by the API layer). */
function isBundle(data: unknown): data is DisplayData {
  return typeof data === 'object' && data !== null && !Array.isArray(data);
}

/** A guest's exit code; -1 when it sent none that is valid. */
function exitCode(msg: GuestMessage): number {
  return Number.isInteger(msg.code) ? (msg.code as number) : -1;
}

/** The exit code of an exec cancelled for `reason` (guest/PROTOCOL.md, cancel). */
function cancelExitCode(reason: CancelReason): number {
  return reason === 'timeout' ? 124 : 130;
}

/**
 * Everything from the guest is untrusted: code running as root in the VM can write to these
 * channels. A malformed message is dropped; nothing it contains may throw here, since an
 * exception in a socket handler would take hostd and every other sandbox down.
 */
function guestReader(socket: Socket, onMessage: (msg: GuestMessage) => void): LineReader {
  return new LineReader(
    socket,
    (line) => {
      const msg = parseJsonObject(line); // null: a torn line from before a restore, or noise
      if (msg) onMessage(msg as GuestMessage);
    },
    MAX_GUEST_LINE,
  );
}

/**
 * One connection to one VM's agent and REPL worker. Emits `close` once, when either socket
 * closes. Output of the running exec is delivered to its sink; `pause()`/`resume()` stop
 * reading the sockets, which makes QEMU stop draining the virtio queues, which blocks the
 * guest's writers: end-to-end backpressure.
 */
export class AgentChannel extends EventEmitter {
  private readonly sinks = new Map<number, ReplSink>();
  /** Python execs not yet ended, with the reason of their cancel once there is one. */
  private readonly python = new Map<number, CancelReason | null>();
  private helloWaiter: { nonce: string; resolve: (msg: GuestMessage) => void } | null = null;
  /**
   * Whether the agent's last hello said it serves prepare_pause. An agent from before it would
   * not answer (a VM re-adopted from an older hostd), so a pause must not wait for it there.
   */
  servesPreparePause = false;
  /** Control requests waiting for their answer (set_env, cancel_all, prepare_*), by nonce. */
  private readonly answers = new Map<string, (msg: GuestMessage) => void>();
  private synced = false;
  /**
   * The REPL port's own hello: sent with the first Python exec after each agent hello (not
   * with that hello: a fork child would then run the worker before it is even asked for),
   * and everything the worker sends before its echo is discarded, as on the agent port.
   */
  private replNonce: string | null = null;
  private replSynced = false;
  private closedReason: string | null = null;
  /**
   * Exec ids are unique per connection; a random start keeps them apart from those of an
   * earlier connection to the same VM (a hostd that crashed), whose late messages may still come.
   */
  private nextExecId = 1 + Math.floor(Math.random() * 2 ** 30);
  private readonly control: LineReader;
  private readonly repl: LineReader;

  private constructor(control: Socket, repl: Socket) {
    super();
    this.control = guestReader(control, (msg) => this.onControl(msg));
    this.repl = guestReader(repl, (msg) => this.onRepl(msg));
    for (const socket of [control, repl]) {
      socket.on('close', () => this.onClose('the agent connection closed'));
    }
  }

  /** Connects to the VM's agent and REPL sockets (QEMU creates them at start-up). */
  static async connect(
    agentPath: string,
    replPath: string,
    deadline: number,
  ): Promise<AgentChannel> {
    const control = await connectWithRetry(agentPath, deadline);
    try {
      return new AgentChannel(control, await connectWithRetry(replPath, deadline));
    } catch (err) {
      control.destroy();
      throw err;
    }
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /**
   * Sends hello (clock, RNG seed) and waits for its echo. Everything read before the echo is
   * discarded: a restored VM may carry half a line from the instant it was frozen. Resolves
   * with what the echo says of the guest's network relay, for NetChannel.acceptQuiet. `copy`
   * says the VM is a new copy of a frozen state (a new sandbox, a fork child), whose Python
   * generators its siblings share: the worker reseeds them. A VM that goes on (resumed from a
   * pause, re-adopted after a restart) keeps them as its user seeded them.
   */
  hello(timeoutMs: number, copy: boolean): Promise<{ quietRelay: QuietRelay | null }> {
    if (this.closedReason) return Promise.reject(new AgentError(this.closedReason));
    const nonce = randomBytes(8).toString('hex');
    this.synced = false;
    this.replNonce = null;
    this.replSynced = false;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.helloWaiter = null;
        reject(new AgentError(`the guest agent did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const onClose = (reason: string): void => {
        clearTimeout(timer);
        reject(new AgentError(reason));
      };
      this.once('close', onClose);
      this.helloWaiter = {
        nonce,
        resolve: (msg) => {
          clearTimeout(timer);
          this.off('close', onClose);
          this.servesPreparePause = msg.prepare_pause === true;
          resolve({ quietRelay: parseQuietRelay(msg.net) });
        },
      };
      this.send(this.control, {
        op: 'hello',
        nonce,
        time_ns: (BigInt(Date.now()) * 1_000_000n).toString(),
        seed: randomBytes(32).toString('hex'),
        copy,
      });
    });
  }

  /**
   * Sends control request `op` (with a fresh nonce) and resolves with the guest's answer, the
   * message with the same op and nonce; rejects when the guest does not answer in `timeoutMs`
   * or the channel closes.
   */
  request(
    op: string,
    fields: Record<string, unknown>,
    timeoutMs: number,
    answerOp = op,
  ): Promise<GuestMessage> {
    if (this.closedReason) return Promise.reject(new AgentError(this.closedReason));
    const nonce = randomBytes(8).toString('hex');
    return new Promise((resolve, reject) => {
      const done = (): void => {
        clearTimeout(timer);
        this.answers.delete(`${answerOp}:${nonce}`);
        this.off('close', onClose);
      };
      const timer = setTimeout(() => {
        done();
        reject(new AgentError(`the guest agent did not answer ${op} within ${timeoutMs} ms`));
      }, timeoutMs);
      const onClose = (reason: string): void => {
        done();
        reject(new AgentError(reason));
      };
      this.once('close', onClose);
      this.answers.set(`${answerOp}:${nonce}`, (msg) => {
        done();
        resolve(msg);
      });
      this.send(this.control, { op, nonce, ...fields });
    });
  }

  /**
   * Whether the agent answers a ping within `timeoutMs`. Its pong comes from the thread that
   * ends execs, after what that thread has queued: so it tells a guest that is slow (a busy
   * host, a fork bomb) from one that is wedged.
   */
  ping(timeoutMs: number): Promise<boolean> {
    return this.request('ping', {}, timeoutMs, 'pong').then(
      () => true,
      () => false, // no answer, or the connection is gone: both mean "not answering"
    );
  }

  /** Starts an exec; returns its id for cancel(). The sink receives its output. */
  exec({ language, code, env, cwd, display, context, notebook }: ExecSpec, sink: ExecSink): number {
    // Options only when given: the hot path's message stays as small as before.
    const options = {
      ...(env === undefined ? {} : { env }),
      ...(cwd === undefined ? {} : { cwd }),
      ...(display ? { display: true } : {}),
    };
    if (language !== 'bash') {
      return this.toRepl(
        {
          op: 'exec',
          code,
          ...options,
          ...(context === undefined ? {} : { context }),
          ...(notebook ? { notebook: true } : {}),
        },
        sink,
      );
    }
    const id = this.nextExecId++;
    if (this.closedReason) {
      queueMicrotask(() => sink.onLost(this.closedReason ?? 'closed'));
      return id;
    }
    this.sinks.set(id, sink);
    this.send(this.control, { op: 'exec', id, language, code, ...options });
    return id;
  }

  /**
   * A request about the REPL's contexts: the worker serves it in turn with the Python execs
   * (it takes an exec id) and answers once. Rejects when it does not answer in `timeoutMs`.
   */
  context(request: ContextRequest, timeoutMs: number): Promise<ContextAnswer> {
    return new Promise((resolve, reject) => {
      let answer: ContextAnswer | null = null;
      const timer = setTimeout(() => {
        this.sinks.delete(id);
        this.python.delete(id);
        reject(new AgentError(`the Python REPL did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const id = this.toRepl(
        { op: 'context', ...request },
        {
          onOutput: () => undefined,
          onContext: (a) => (answer = a),
          onExit: () => {
            clearTimeout(timer);
            if (answer) resolve(answer);
            else reject(new AgentError('the Python REPL exited before it answered'));
          },
          onLost: (reason) => {
            clearTimeout(timer);
            reject(new AgentError(reason));
          },
        },
      );
    });
  }

  /** Sends an exec or a context request to the REPL worker under a new exec id. */
  private toRepl(msg: Record<string, unknown>, sink: ReplSink): number {
    const id = this.nextExecId++;
    if (this.closedReason) {
      queueMicrotask(() => sink.onLost(this.closedReason ?? 'closed'));
      return id;
    }
    this.sinks.set(id, sink);
    this.python.set(id, null);
    // One write: the worker reads its hello and the exec together.
    const hello = this.replNonce === null ? this.newReplHello() : '';
    this.repl.write(hello + JSON.stringify({ ...msg, id }) + '\n');
    return id;
  }

  /** Cancels go to the agent, which interrupts the worker or kills bash. */
  cancel(id: number, reason: CancelReason): void {
    if (!this.sinks.has(id)) return;
    if (this.python.get(id) === null) this.python.set(id, reason);
    this.send(this.control, { op: 'cancel', id, reason });
  }

  pause(): void {
    this.control.socket.pause();
    this.repl.socket.pause();
  }

  resume(): void {
    this.control.socket.resume();
    this.repl.socket.resume();
  }

  close(reason = 'the agent connection was closed by hostd'): void {
    this.onClose(reason);
    this.control.socket.destroy();
    this.repl.socket.destroy();
  }

  private send(to: LineReader, msg: Record<string, unknown>): void {
    to.write(JSON.stringify(msg) + '\n');
  }

  private onControl(msg: GuestMessage): void {
    if (msg.op === 'hello' && this.helloWaiter && msg.nonce === this.helloWaiter.nonce) {
      this.synced = true;
      const waiter = this.helloWaiter;
      this.helloWaiter = null;
      waiter.resolve(msg);
      return;
    }
    if (!this.synced) return;
    const answer = this.answers.get(`${msg.op}:${String(msg.nonce)}`);
    if (answer) answer(msg);
    else this.onExecMessage(msg);
  }

  private onRepl(msg: GuestMessage): void {
    if (msg.op === 'repl_died') {
      this.onReplDied(msg);
      return;
    }
    if (!this.replSynced) {
      this.replSynced = msg.op === 'hello' && msg.nonce === this.replNonce;
      return;
    }
    this.onExecMessage(msg);
  }

  /**
   * The worker died; the agent has sent the exit of the exec it was running. Ends the Python
   * execs it had taken from the port (`upto`) but not run, and the cancelled ones (a worker
   * wedged by a thread of user code may have read an exec it could not even parse). Later
   * ones wait in the port for the next worker. Accepted before the REPL hello's echo too: a
   * worker may die holding that hello, and the next one needs a fresh one.
   */
  private onReplDied(msg: GuestMessage): void {
    const code = exitCode(msg);
    const upto = Number.isInteger(msg.upto) ? (msg.upto as number) : Infinity;
    for (const [id, reason] of [...this.python]) {
      if (reason !== null) this.endExec(id, cancelExitCode(reason));
      else if (id <= upto) this.endExec(id, code);
    }
    if (!this.replSynced && this.replNonce !== null) this.repl.write(this.newReplHello());
  }

  /** A REPL hello line with a fresh nonce, which becomes the one its echo must carry. */
  private newReplHello(): string {
    this.replNonce = randomBytes(8).toString('hex');
    return JSON.stringify({ op: 'hello', nonce: this.replNonce }) + '\n';
  }

  private onExecMessage(msg: GuestMessage): void {
    if (typeof msg.id !== 'number') return;
    const sink = this.sinks.get(msg.id);
    if (!sink) return;
    if (msg.op === 'out' && typeof msg.data === 'string') {
      sink.onOutput(msg.stream === 'stderr' ? 'stderr' : 'stdout', msg.data, msg.partial === true);
    } else if (msg.op === 'display' && isBundle(msg.data)) {
      sink.onDisplay?.(msg.data);
    } else if (msg.op === 'result' && isBundle(msg.data)) {
      sink.onResult?.(msg.data);
    } else if (msg.op === 'exception') {
      sink.onError?.({
        name: text(msg.name),
        value: text(msg.value),
        traceback: text(msg.traceback),
      });
    } else if (msg.op === 'start') {
      const count = msg.execution_count;
      sink.onStart?.(Number.isInteger(count) ? (count as number) : null);
    } else if (msg.op === 'context') {
      sink.onContext?.(contextAnswer(msg));
    } else if (msg.op === 'exit') {
      if (typeof msg.rejected === 'string') sink.onRejected?.(msg.rejected);
      this.endExec(msg.id, exitCode(msg));
    }
  }

  private endExec(id: number, code: number): void {
    const sink = this.sinks.get(id);
    this.sinks.delete(id);
    this.python.delete(id);
    sink?.onExit(code);
  }

  private onClose(reason: string): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    const sinks = [...this.sinks.values()];
    this.sinks.clear();
    this.python.clear();
    for (const sink of sinks) sink.onLost(reason);
    this.emit('close', reason);
  }
}
