/**
 * One connection a guest program opened through the network port (net-channel.ts): either to
 * the guest's egress proxy, whose HTTP request says where it goes, or to host.hostd.internal
 * on a port. It is judged (EgressGate: the name first, then each resolved address), connected
 * to an address the gate allowed (the name is never resolved twice: no DNS rebinding), then
 * relayed with per-connection credit in both directions. A refusal is answered at once: 403
 * with the reason for a proxy request, 502 when the connection failed; never a hang.
 */
import { connect, type Socket } from 'node:net';
import { HOST_ALIAS, type EgressGate } from './egress-gate.js';
import { Kind, MAX_TO_GUEST_PAYLOAD } from './port-frames.js';
import { CONNECT_ESTABLISHED, parseProxyRequest, proxyAnswer } from './proxy-request.js';

/** Bytes one side may send on a connection before the other gives credit back (both sides). */
export const NET_WINDOW = 64 * 1024;

/** What happened to a connection, for hostd's logs and metrics. */
export type NetEvent =
  | {
      readonly type: 'connected';
      readonly host: string;
      readonly port: number;
      readonly address: string;
    }
  | {
      readonly type: 'refused';
      readonly host: string | null;
      readonly port: number | null;
      readonly reason: string;
    }
  | {
      readonly type: 'failed';
      readonly host: string;
      readonly port: number;
      readonly reason: string;
    };

/** What a connection needs from its channel. */
export interface ConnectionContext {
  send(kind: number, id: number, payload?: Buffer): void;
  readonly gate: EgressGate;
  resolve(host: string): Promise<string[]>;
  readonly connectTimeoutMs: number;
  /** Bytes that left for the outside ('out') or came back from it ('in'). */
  count(direction: 'in' | 'out', bytes: number): void;
  event(event: NetEvent): void;
  /** The connection is over on both sides: forget it. */
  release(id: number): void;
}

const credit = (n: number): Buffer => {
  const payload = Buffer.allocUnsafe(4);
  payload.writeUInt32BE(n, 0);
  return payload;
};

/** A connection from its OPEN to its end on both sides; see the file's comment. */
export class RelayedConnection {
  private phase: 'head' | 'opening' | 'open' | 'done' = 'head';
  private head: Buffer[] = [];
  private headBytes = 0;
  /** Guest bytes that came before the remote was connected (within the window). */
  private early: Buffer[] = [];
  private remote: Socket | null = null;
  /** Bytes the guest may still send (what it has not been given credit for is held here). */
  private guestCredit = NET_WINDOW;
  /** Bytes this end may still send to the guest. */
  private toGuestCredit = NET_WINDOW;
  /** Remote bytes waiting for credit; the remote socket is paused while there are any. */
  private pending: Buffer[] = [];
  private remoteEof = false;
  private remoteGone = false;
  private endSent = false;
  private guestEnded = false;
  /** Guest bytes the remote took, not yet given back as credit. */
  private unacked = 0;

  /**
   * @param port null for a proxy connection (the request names the target), else the port
   *   of host.hostd.internal the guest connected to
   */
  constructor(
    readonly id: number,
    private readonly port: number | null,
    private readonly ctx: ConnectionContext,
  ) {}

  /** Whether the remote is paused: the guest has not taken what came from it yet. */
  get waitingOnGuest(): boolean {
    return this.pending.length > 0;
  }

  start(): void {
    if (this.port !== null) void this.open(HOST_ALIAS, this.port, null);
  }

  // ---- frames from the guest ------------------------------------------------------------

  data(piece: Buffer): void {
    if (this.phase === 'done') return;
    this.guestCredit -= piece.length;
    if (this.guestCredit < 0) return this.abort('the guest sent beyond its credit', true);
    if (this.phase === 'open') return this.toRemote(piece);
    if (this.phase === 'opening') {
      this.early.push(Buffer.from(piece)); // a view of the port's chunk: copy what is kept
      return;
    }
    this.head.push(Buffer.from(piece));
    this.headBytes += piece.length;
    this.parseHead();
  }

  end(): void {
    if (this.phase === 'done') return;
    this.guestEnded = true;
    if (this.phase === 'head') {
      return this.refuse(400, 'the request ended before its head was complete');
    }
    if (this.phase === 'open') this.remote?.end();
    this.maybeDone();
  }

  credit(n: number): void {
    if (this.phase === 'done') return;
    this.toGuestCredit += n;
    this.flushToGuest();
  }

  /** The guest closed it (CLOSE), or the channel is being reset: no more frames either way. */
  close(): void {
    if (this.phase === 'done') return;
    this.phase = 'done';
    this.remote?.destroy();
    this.ctx.release(this.id);
  }

  // ---- opening --------------------------------------------------------------------------

  private parseHead(): void {
    const buffer = this.head.length === 1 ? this.head[0]! : Buffer.concat(this.head);
    this.head = [buffer];
    const request = parseProxyRequest(buffer);
    if (request === null) return;
    if (request.kind === 'invalid') return this.refuse(request.status, request.reason);
    this.head = [];
    // The head is consumed (parsed, or rewritten into our own buffer): its credit goes back
    const consumed = this.headBytes - request.rest.length;
    this.guestCredit += consumed;
    this.ctx.send(Kind.credit, this.id, credit(consumed));
    if (request.rest.length) this.early.push(request.rest);
    void this.open(request.host, request.port, request.kind === 'forward' ? request.head : null);
  }

  /**
   * Judges the target, resolves it, connects. `forwardHead` is the rewritten request of an
   * absolute-form proxy request; null for CONNECT and host.hostd.internal connections.
   */
  private async open(host: string, port: number, forwardHead: Buffer | null): Promise<void> {
    this.phase = 'opening';
    const byName = this.ctx.gate.checkName(host, port);
    if (!byName.allow) return this.refuse(403, byName.reason, host, port);
    let addresses: string[];
    try {
      addresses = await this.ctx.resolve(host);
    } catch (err) {
      return this.refuse(502, `cannot resolve ${host}: ${errorCode(err)}`, host, port);
    }
    if (this.phase !== 'opening') return; // the guest gave up meanwhile
    const byAddress = this.ctx.gate.checkAddresses(host, port, addresses);
    if (!byAddress.allow) return this.refuse(403, byAddress.reason, host, port);
    let remote: Socket;
    let address: string;
    try {
      [remote, address] = await connectFirst(byAddress.addresses, port, this.ctx.connectTimeoutMs);
    } catch (err) {
      return this.refuse(502, `cannot connect to ${host}:${port}: ${errorCode(err)}`, host, port);
    }
    if (this.phase !== 'opening') {
      remote.destroy();
      return;
    }
    this.ctx.event({ type: 'connected', host, port, address });
    this.remote = remote;
    this.phase = 'open';
    remote.on('data', (chunk: Buffer) => {
      this.ctx.count('in', chunk.length);
      this.toGuest(chunk);
    });
    remote.on('end', () => {
      this.remoteEof = true;
      this.flushToGuest();
    });
    remote.on('error', () => undefined); // 'close' follows
    remote.on('close', () => this.remoteClosed());
    // (remote data events come from the next I/O round at the earliest: the 200 goes first)
    if (this.port === null && forwardHead === null) this.toGuest(CONNECT_ESTABLISHED);
    if (forwardHead) {
      this.ctx.count('out', forwardHead.length);
      remote.write(forwardHead);
    }
    for (const piece of this.early.splice(0)) this.toRemote(piece);
    if (this.guestEnded) remote.end();
  }

  /** Answers the guest's client and forgets the connection. */
  private refuse(
    status: number,
    reason: string,
    host: string | null = null,
    port: number | null = null,
  ): void {
    if (this.phase === 'done') return;
    this.ctx.event(
      status === 502 && host !== null && port !== null
        ? { type: 'failed', host, port, reason }
        : { type: 'refused', host, port, reason },
    );
    // A proxy client gets an answer (smaller than the window, which is untouched so far);
    // a raw TCP connection to host.hostd.internal is just closed.
    if (this.port === null) this.ctx.send(Kind.data, this.id, proxyAnswer(status, reason));
    this.abort(reason, true);
  }

  private abort(_reason: string, tellGuest: boolean): void {
    if (this.phase === 'done') return;
    if (tellGuest) this.ctx.send(Kind.close, this.id);
    this.close();
  }

  // ---- relaying -------------------------------------------------------------------------

  private toRemote(piece: Buffer): void {
    const remote = this.remote!;
    this.ctx.count('out', piece.length);
    remote.write(piece, () => {
      if (this.phase === 'done') return;
      this.unacked += piece.length;
      // Batched, and at once when the remote took everything (the guest may be waiting)
      if (this.unacked >= NET_WINDOW / 4 || remote.writableLength === 0) {
        this.guestCredit += this.unacked;
        this.ctx.send(Kind.credit, this.id, credit(this.unacked));
        this.unacked = 0;
      }
    });
  }

  private toGuest(chunk: Buffer): void {
    this.pending.push(chunk);
    this.flushToGuest();
  }

  /** Sends what the guest's credit allows; pauses the remote while anything waits. */
  private flushToGuest(): void {
    while (this.pending.length && this.toGuestCredit > 0) {
      const chunk = this.pending[0]!;
      const n = Math.min(chunk.length, this.toGuestCredit, MAX_TO_GUEST_PAYLOAD);
      this.ctx.send(Kind.data, this.id, chunk.subarray(0, n));
      this.toGuestCredit -= n;
      if (n === chunk.length) this.pending.shift();
      else this.pending[0] = chunk.subarray(n);
    }
    if (this.pending.length) this.remote?.pause();
    else this.remote?.resume();
    if (!this.pending.length && this.remoteEof && !this.endSent) {
      this.endSent = true;
      this.ctx.send(Kind.end, this.id);
      this.maybeDone();
    }
  }

  private remoteClosed(): void {
    if (this.phase === 'done') return;
    // Reset, or failed before its end: what was not delivered is lost, as with TCP
    if (!this.remoteEof) return this.abort('the remote connection was reset', true);
    this.remoteGone = true;
    this.maybeDone();
  }

  /**
   * Both directions ended in order and the remote socket is closed: the guest drops the
   * connection once it has written what it got, with no frame needed.
   */
  private maybeDone(): void {
    if (this.remoteGone && this.endSent && this.guestEnded) this.close();
  }
}

function errorCode(err: unknown): string {
  if (err instanceof Error) return (err as NodeJS.ErrnoException).code ?? err.message;
  return String(err);
}

/** Connects to the first address that answers, in order. */
async function connectFirst(
  addresses: readonly string[],
  port: number,
  timeoutMs: number,
): Promise<[Socket, string]> {
  let last: unknown = new Error('no address');
  for (const address of addresses) {
    try {
      return [await connectOne(address, port, timeoutMs), address];
    } catch (err) {
      last = err;
    }
  }
  throw last;
}

function connectOne(address: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: address, port, allowHalfOpen: true, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(Object.assign(new Error('timed out'), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      socket.destroy();
      reject(err);
    });
  });
}
