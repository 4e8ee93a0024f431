/**
 * Host side of the guest agent protocol (guest/PROTOCOL.md): newline-delimited JSON over the
 * unix socket that QEMU bridges to the guest's virtio-serial port `hostd.agent`.
 * Hand-written because the protocol is ours.
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import { connectWithRetry } from './qmp.js';

export type OutputStream = 'stdout' | 'stderr';
export type Language = 'python' | 'bash';
export type CancelReason = 'timeout' | 'client' | 'shutdown';

/** Receives one exec's output; the channel calls exactly one of onExit / onLost last. */
export interface ExecSink {
  onOutput(stream: OutputStream, data: string): void;
  onExit(code: number): void;
  /** The channel closed (VM died, agent lost) before the exec's exit arrived. */
  onLost(reason: string): void;
}

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
  data?: string;
  code?: number;
  message?: string;
}

/**
 * One connection to one VM's agent. Emits `close` once. Output of the running exec is
 * delivered to its sink; `pause()`/`resume()` stop reading the socket, which makes QEMU stop
 * draining the virtio queue, which blocks the guest's writer: end-to-end backpressure.
 */
export class AgentChannel extends EventEmitter {
  private buffer = '';
  private readonly sinks = new Map<number, ExecSink>();
  private helloWaiter: { nonce: string; resolve: () => void } | null = null;
  private synced = false;
  private closedReason: string | null = null;
  private nextExecId = 1;

  private constructor(private readonly socket: Socket) {
    super();
    socket.setEncoding('utf8');
    socket.setNoDelay?.(true);
    socket.on('data', (chunk: string) => this.onData(chunk));
    socket.on('error', () => undefined);
    socket.on('close', () => this.onClose('the agent connection closed'));
  }

  /** Connects to the VM's agent socket (QEMU creates it at start-up). */
  static async connect(path: string, deadline: number): Promise<AgentChannel> {
    return new AgentChannel(await connectWithRetry(path, deadline));
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /**
   * Sends hello (clock, RNG seed) and waits for its echo. Everything read before the echo is
   * discarded: a restored VM may carry half a line from the instant it was frozen.
   */
  hello(timeoutMs: number): Promise<void> {
    if (this.closedReason) return Promise.reject(new AgentError(this.closedReason));
    const nonce = randomBytes(8).toString('hex');
    this.synced = false;
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
        resolve: () => {
          clearTimeout(timer);
          this.off('close', onClose);
          resolve();
        },
      };
      this.send({
        op: 'hello',
        nonce,
        time_ns: (BigInt(Date.now()) * 1_000_000n).toString(),
        seed: randomBytes(32).toString('hex'),
      });
    });
  }

  /** Starts an exec; returns its id for cancel(). The sink receives its output. */
  exec(language: Language, code: string, sink: ExecSink): number {
    const id = this.nextExecId++;
    if (this.closedReason) {
      queueMicrotask(() => sink.onLost(this.closedReason ?? 'closed'));
      return id;
    }
    this.sinks.set(id, sink);
    this.send({ op: 'exec', id, language, code });
    return id;
  }

  cancel(id: number, reason: CancelReason): void {
    if (this.sinks.has(id)) this.send({ op: 'cancel', id, reason });
  }

  pause(): void {
    this.socket.pause();
  }

  resume(): void {
    this.socket.resume();
  }

  close(reason = 'the agent connection was closed by hostd'): void {
    this.onClose(reason);
    this.socket.destroy();
  }

  private send(msg: Record<string, unknown>): void {
    this.socket.write(JSON.stringify(msg) + '\n');
  }

  private onData(chunk: string): void {
    // Only the new chunk can hold a newline the old buffer did not: scan from there, so a
    // guest sending one endless line costs linear, not quadratic, time.
    const from = this.buffer.length;
    this.buffer += chunk;
    let start = 0;
    let nl = this.buffer.indexOf('\n', from);
    for (; nl >= 0; nl = this.buffer.indexOf('\n', start)) {
      const line = this.buffer.slice(start, nl);
      start = nl + 1;
      this.onLine(line);
    }
    this.buffer = start === 0 ? this.buffer : this.buffer.slice(start);
    // The agent never sends a line over 1 MiB (PROTOCOL.md); anything bigger is garbage.
    if (this.buffer.length > 4 * 1024 * 1024) this.buffer = '';
  }

  /**
   * Everything from the guest is untrusted: code running as root in the VM can write to this
   * channel. A malformed message is dropped; nothing it contains may throw here, since an
   * exception in a socket handler would take hostd and every other sandbox down.
   */
  private onLine(line: string): void {
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch {
      return; // a torn line from before a restore, or noise before hello
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return;
    const msg = parsed as GuestMessage;
    if (msg.op === 'hello' && this.helloWaiter && msg.nonce === this.helloWaiter.nonce) {
      this.synced = true;
      const waiter = this.helloWaiter;
      this.helloWaiter = null;
      waiter.resolve();
      return;
    }
    if (!this.synced || typeof msg.id !== 'number') return;
    const sink = this.sinks.get(msg.id);
    if (!sink) return;
    if (msg.op === 'out' && typeof msg.data === 'string') {
      sink.onOutput(msg.stream === 'stderr' ? 'stderr' : 'stdout', msg.data);
    } else if (msg.op === 'exit') {
      this.sinks.delete(msg.id);
      sink.onExit(Number.isInteger(msg.code) ? (msg.code as number) : -1);
    }
  }

  private onClose(reason: string): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    const sinks = [...this.sinks.values()];
    this.sinks.clear();
    for (const sink of sinks) sink.onLost(reason);
    this.emit('close', reason);
  }
}
