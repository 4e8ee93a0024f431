/**
 * A minimal QMP (QEMU Machine Protocol) client over a unix socket. Hand-written because no
 * maintained npm package speaks QMP; we need only: greeting, capabilities negotiation,
 * commands with ids, and waiting for events (RESUME after an incoming restore).
 */
import type { Socket } from 'node:net';
import { EventEmitter } from 'node:events';
import { connectWithRetry, LineReader, parseJsonObject } from '../channels/unix-socket.js';

/** QMP answers to the commands hostd sends are small; anything longer is a broken QEMU. */
const MAX_QMP_LINE = 1024 * 1024;

interface Pending {
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
  command: string;
}

/** A QMP error reply, or the connection closing while a command was pending. */
export class QmpError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'QmpError';
  }
}

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
}

/**
 * Connected, negotiated QMP session. Emits `event` (QmpEvent) and `close`.
 * Use `QmpClient.connect(path)`; it retries while QEMU has not created the socket yet.
 */
export class QmpClient extends EventEmitter {
  private nextId = 1;
  private readonly pending = new Map<string, Pending>();
  private closed = false;

  private constructor(private readonly socket: Socket) {
    super();
    new LineReader(socket, (line) => this.onLine(line), MAX_QMP_LINE);
    socket.on('close', () => this.onClose());
  }

  /** Connects to `path`, retrying every 2 ms until `deadline` (epoch ms), then negotiates. */
  static async connect(path: string, deadline: number): Promise<QmpClient> {
    const socket = await connectWithRetry(path, deadline);
    const client = new QmpClient(socket);
    await client.greeting();
    await client.execute('qmp_capabilities');
    return client;
  }

  private greetingWaiter: ((ok: boolean) => void) | null = null;
  private greeted = false;

  private greeting(): Promise<void> {
    if (this.greeted) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.greetingWaiter = (ok) =>
        ok ? resolve() : reject(new QmpError('QMP closed before greeting'));
    });
  }

  private onLine(line: string): void {
    const msg = parseJsonObject(line);
    if (msg) this.onMessage(msg);
  }

  private onMessage(msg: Record<string, unknown>): void {
    if ('QMP' in msg) {
      this.greeted = true;
      this.greetingWaiter?.(true);
      return;
    }
    if ('event' in msg) {
      this.emit('event', msg as unknown as QmpEvent);
      return;
    }
    const id = typeof msg.id === 'string' ? msg.id : undefined;
    const waiter = id === undefined ? undefined : this.pending.get(id);
    if (!waiter || id === undefined) return;
    this.pending.delete(id);
    if ('error' in msg) {
      const err = msg.error as { class?: string; desc?: string };
      waiter.reject(new QmpError(`${waiter.command}: ${err.desc ?? err.class ?? 'QMP error'}`));
    } else {
      waiter.resolve(msg.return);
    }
  }

  private onClose(): void {
    this.closed = true;
    this.greetingWaiter?.(false);
    for (const waiter of this.pending.values()) {
      waiter.reject(new QmpError(`${waiter.command}: QMP connection closed`));
    }
    this.pending.clear();
    this.emit('close');
  }

  /**
   * Runs one QMP command and resolves with its `return` value. A QEMU whose monitor stops
   * answering must not hold a sandbox's queue (or a pool refill) forever: after `timeoutMs`
   * the command fails.
   */
  execute(command: string, args?: Record<string, unknown>, timeoutMs = 30_000): Promise<unknown> {
    if (this.closed) return Promise.reject(new QmpError(`${command}: QMP connection closed`));
    const id = String(this.nextId++);
    const payload = JSON.stringify(
      args ? { execute: command, arguments: args, id } : { execute: command, id },
    );
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new QmpError(`${command}: QEMU did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const settle =
        <T>(fn: (v: T) => void) =>
        (v: T): void => {
          clearTimeout(timer);
          fn(v);
        };
      this.pending.set(id, { resolve: settle(resolve), reject: settle(reject), command });
      this.socket.write(payload + '\n');
    });
  }

  /** Resolves with the first event named `name` whose data satisfies `match`. */
  waitEvent(
    name: string,
    match: (data: Record<string, unknown>) => boolean,
    timeoutMs: number,
  ): Promise<QmpEvent> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        cleanup();
        reject(new QmpError(`timed out after ${timeoutMs} ms waiting for QMP event ${name}`));
      }, timeoutMs);
      const onEvent = (ev: QmpEvent): void => {
        if (ev.event === name && match(ev.data ?? {})) {
          cleanup();
          resolve(ev);
        }
      };
      const onClose = (): void => {
        cleanup();
        reject(new QmpError(`QMP closed while waiting for event ${name}`));
      };
      const cleanup = (): void => {
        clearTimeout(timer);
        this.off('event', onEvent);
        this.off('close', onClose);
      };
      this.on('event', onEvent);
      this.on('close', onClose);
    });
  }

  close(): void {
    this.socket.destroy();
  }
}
