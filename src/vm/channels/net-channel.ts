/**
 * Host side of one VM's network port, `hostd.net` (guest/PROTOCOL.md, "Network port"). The
 * guest has no network device: its only way out is this port, on which the guest's relay
 * (guest/agent/net_relay.py) multiplexes the connections its programs open to the egress
 * proxy and to host.hostd.internal. Each is judged by the sandbox's EgressGate, connected
 * from here and relayed (net-connection.ts), so root in the guest cannot widen the rules.
 *
 * Call sync() after the VM is created and after every restore: it resets every connection
 * (a restored guest holds connections of another VM) and tells the guest which ports of
 * host.hostd.internal to listen on. Until the first sync the channel ignores the guest.
 */
import { Resolver } from 'node:dns/promises';
import { EventEmitter } from 'node:events';
import { isIP, type Socket } from 'node:net';
import { HOST_ALIAS, type EgressGate } from './egress-gate.js';
import { type NetEvent, RelayedConnection } from './net-connection.js';
import { transferGc } from './young-gc.js';
import {
  FrameParser,
  type FrameSink,
  Kind,
  helloBytes,
  newNonce,
  parseJsonObject,
} from './port-frames.js';

export { type NetEvent, NET_WINDOW } from './net-connection.js';

export { NET_PORT_NAME } from './port-names.js';
const PROTOCOL_VERSION = 1;

/** How a VM's connections are judged and opened. */
export interface NetChannelOptions {
  /** Decides every connection; replace it with `channel.gate = ...` when the rules change. */
  readonly gate: EgressGate;
  /** Host name to addresses. Default: DNS (c-ares, not the libuv thread pool that file I/O needs), and host.hostd.internal to 127.0.0.1. */
  readonly resolve?: (host: string) => Promise<string[]>;
  readonly connectTimeoutMs?: number;
  /** Connections open at once; more are closed at once. Default 128. */
  readonly maxConnections?: number;
  readonly onEvent?: (event: NetEvent) => void;
}

/**
 * What the guest's relay said of itself in the agent's hello reply (guest/PROTOCOL.md, `net`):
 * it holds no connection and nothing half-sent or half-read, and listens on these ports.
 */
export interface QuietRelay {
  readonly ports: readonly number[];
}

/** The hello reply's `net` field, or null when it is absent, null or malformed. */
export function parseQuietRelay(value: unknown): QuietRelay | null {
  if (typeof value !== 'object' || value === null) return null;
  const ports = (value as { ports?: unknown }).ports;
  if (!Array.isArray(ports) || !ports.every((p) => Number.isInteger(p))) return null;
  return { ports: ports as number[] };
}

/** What the guest's relay answered a sync with. */
export interface NetSyncResult {
  /** Ports of host.hostd.internal it listens on. */
  readonly ports: number[];
  /** Ports it could not listen on, and why. */
  readonly failed: { port: number; error: string }[];
  /** Whether its proxy listens. */
  readonly proxy: boolean;
}

/** For the sandbox's `network` field and metrics. */
export interface NetStats {
  /** Bytes that reached the outside from this VM's connections. */
  readonly bytesOut: number;
  /** Bytes that came back. */
  readonly bytesIn: number;
  readonly openConnections: number;
  /** Connections whose remote is paused because the guest does not take its bytes. */
  readonly waitingOnGuest: number;
}

/** Bytes hostd lets wait for a guest that does not read its port before it stops reading. */
const MAX_UNREAD = 16 * 1024 * 1024;

const LIMITS = {
  kinds: new Set<number>([Kind.json, Kind.open, Kind.data, Kind.end, Kind.close, Kind.credit]),
  maxData: 64 * 1024,
  maxControl: 64 * 1024,
};

/**
 * One VM's network port. Emits `close` (with the reason) once, when the socket closed; its
 * connections are then dropped.
 */
export class NetChannel extends EventEmitter {
  gate: EgressGate;
  private readonly parser: FrameParser;
  private readonly conns = new Map<number, RelayedConnection>();
  private readonly resolveHost: (host: string) => Promise<string[]>;
  private readonly connectTimeoutMs: number;
  private readonly maxConnections: number;
  private readonly onEvent: (event: NetEvent) => void;
  private bytesOut = 0;
  private bytesIn = 0;
  private ports: readonly number[] = [];
  /** The last sync's answer while it still holds: no connection was opened since. */
  private clean: NetSyncResult | null = null;
  private waiter: {
    resolve: (r: NetSyncResult) => void;
    reject: (e: Error) => void;
    timer: NodeJS.Timeout;
  } | null = null;
  /** Whether a sync (or acceptQuiet) ever started over with the guest on this channel. */
  private everSynced = false;
  /** Whether any byte came from the guest since this channel connected. */
  private heardGuest = false;
  private lastRepair = 0;
  private repairTimer: NodeJS.Timeout | null = null;
  private closedReason: string | null = null;

  /**
   * Takes over a connected socket: QEMU's unix-socket chardev for the port, connected when the
   * VM starts, as the agent's (so the guest never sees the port without a host).
   */
  constructor(
    private readonly socket: Socket,
    options: NetChannelOptions,
  ) {
    super();
    this.gate = options.gate;
    this.resolveHost = options.resolve ?? resolveWithDns;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    this.maxConnections = options.maxConnections ?? 128;
    this.onEvent = options.onEvent ?? (() => undefined);
    this.parser = new FrameParser(this.frameSink(), LIMITS);
    socket.on('data', (chunk: Buffer) => {
      this.heardGuest = true;
      this.parser.push(chunk);
    });
    socket.on('error', () => undefined);
    socket.on('close', () => this.onClose('the network channel closed'));
  }

  get stats(): NetStats {
    let waiting = 0;
    for (const conn of this.conns.values()) if (conn.waitingOnGuest) waiting++;
    return {
      bytesOut: this.bytesOut,
      bytesIn: this.bytesIn,
      openConnections: this.conns.size,
      waitingOnGuest: waiting,
    };
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /**
   * Starts over with the guest: drops every connection, and has its relay listen on these
   * ports of host.hostd.internal (those the rules allow). Resolves with its answer.
   */
  sync(ports: readonly number[], timeoutMs = 10_000): Promise<NetSyncResult> {
    if (this.closedReason) return Promise.reject(new Error(this.closedReason));
    // Nothing to start over from: a pool VM synced once when it was made, and its create asks
    // again. The round trip would run the guest's relay beside the sandbox's first exec.
    if (this.clean && !this.waiter && samePorts(ports, this.ports)) {
      return Promise.resolve(this.clean);
    }
    this.clean = null;
    this.everSynced = true;
    this.ports = [...ports];
    this.resetConnections();
    this.waiter?.reject(new Error('superseded by a newer sync'));
    const nonce = newNonce();
    this.parser.awaitSync(nonce);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiter = null;
        reject(new Error(`the guest's network relay did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiter = { resolve, reject, timer };
      this.socket.write(helloBytes(nonce, { version: PROTOCOL_VERSION, ports: this.ports }));
    });
  }

  /**
   * Takes the port as it is instead of a sync, when the guest's relay said in its latest hello
   * (`relay`) that it was quiet, listening on exactly `ports`, and it has sent nothing since
   * this channel connected. Every pool VM and the child of a parent that held no connection
   * then skips the reset's round trip, a good part of a fork child's CPU under TCG
   * (docs/architecture.md, "Measured choices in the code"). Anything
   * the guest sends afterwards is a new connection, in whole frames. Null when a sync is needed.
   */
  acceptQuiet(ports: readonly number[], relay: QuietRelay | null): NetSyncResult | null {
    if (!relay || this.closedReason || this.everSynced || this.heardGuest) return null;
    const wanted = [...new Set(ports)].sort((a, b) => a - b);
    const has = [...relay.ports].sort((a, b) => a - b);
    if (!samePorts(wanted, has)) return null;
    this.everSynced = true;
    this.ports = [...ports];
    this.parser.assumeInSync();
    this.clean = { ports: has, failed: [], proxy: true };
    return this.clean;
  }

  close(reason = 'the network channel was closed by hostd'): void {
    this.onClose(reason);
    this.socket.destroy();
  }

  private send(kind: number, id: number, payload?: Buffer): void {
    if (this.closedReason) return;
    // What hostd sends is bounded by the credits the guest gives back, except its answers to
    // the guest's own frames (a CLOSE for each OPEN over the limit): a guest that sends those
    // and never reads the port is not read either until it does.
    if (this.socket.writableLength > MAX_UNREAD && !this.socket.isPaused()) {
      this.socket.pause();
      this.socket.once('drain', () => this.socket.resume());
    }
    const header = Buffer.allocUnsafe(9);
    header.writeUInt8(kind, 0);
    header.writeUInt32BE(id, 1);
    header.writeUInt32BE(payload?.length ?? 0, 5);
    if (payload?.length) {
      this.socket.cork();
      this.socket.write(header);
      this.socket.write(payload);
      this.socket.uncork();
    } else {
      this.socket.write(header);
    }
  }

  private resetConnections(): void {
    for (const conn of [...this.conns.values()]) conn.close();
    this.conns.clear();
  }

  private onOpen(id: number, payload: Buffer): void {
    this.clean = null;
    const msg = parseJsonObject(payload);
    const port = msg?.port;
    this.conns.get(id)?.close(); // an id reused: the guest restarted its numbering
    if (this.conns.size >= this.maxConnections) {
      this.onEvent({ type: 'refused', host: null, port: null, reason: 'too many connections' });
      this.send(Kind.close, id);
      return;
    }
    if (
      port !== undefined &&
      !(Number.isInteger(port) && (port as number) > 0 && (port as number) < 65536)
    ) {
      this.send(Kind.close, id);
      return;
    }
    const conn = new RelayedConnection(id, (port as number | undefined) ?? null, {
      send: (kind, connId, data) => this.send(kind, connId, data),
      gate: this.gate,
      resolve: (host) => this.resolveHost(host),
      connectTimeoutMs: this.connectTimeoutMs,
      count: (direction, bytes) => {
        if (direction === 'in') this.bytesIn += bytes;
        else this.bytesOut += bytes;
        // Each relayed chunk is a fresh buffer, garbage once written: as for file transfers.
        transferGc.add(bytes);
      },
      event: (event) => this.onEvent(event),
      release: (connId) => {
        if (this.conns.get(connId) === conn) this.conns.delete(connId);
      },
    });
    this.conns.set(id, conn);
    conn.start();
  }

  /**
   * The guest sent something no relay sends: its framing cannot be trusted any more. Every
   * connection goes, and the channel syncs again (at most once a second: a guest that sends
   * garbage on purpose must not make hostd spin).
   */
  private repair(): void {
    this.clean = null;
    this.resetConnections();
    if (this.repairTimer || this.closedReason) return;
    const wait = Math.max(0, this.lastRepair + 1000 - Date.now());
    this.repairTimer = setTimeout(() => {
      this.repairTimer = null;
      this.lastRepair = Date.now();
      // Expected: the channel closed (the VM is gone) or a newer sync (setNetwork) superseded
      // this one. A relay that does not answer leaves the guest without connections until the
      // next sync: its network fails, its sandbox does not.
      this.sync(this.ports).catch(() => undefined);
    }, wait);
  }

  private onClose(reason: string): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.resetConnections();
    if (this.repairTimer) clearTimeout(this.repairTimer);
    if (this.waiter) {
      clearTimeout(this.waiter.timer);
      this.waiter.reject(new Error(reason));
      this.waiter = null;
    }
    this.emit('close', reason);
  }

  private frameSink(): FrameSink {
    return {
      synced: (hello) => {
        const waiter = this.waiter;
        this.waiter = null;
        if (!waiter) return;
        clearTimeout(waiter.timer);
        const result = syncResult(hello);
        this.clean = result;
        waiter.resolve(result);
      },
      data: (id, piece) => this.conns.get(id)?.data(piece),
      frame: (kind, id, payload) => {
        if (kind === Kind.open) return this.onOpen(id, payload);
        const conn = this.conns.get(id);
        if (!conn) return; // closed here meanwhile
        if (kind === Kind.end) conn.end();
        else if (kind === Kind.close) conn.close();
        else if (kind === Kind.credit && payload.length === 4) conn.credit(payload.readUInt32BE(0));
      },
      broken: () => this.repair(),
    };
  }
}

function syncResult(hello: Record<string, unknown>): NetSyncResult {
  const ports = Array.isArray(hello.ports) ? hello.ports.filter(Number.isInteger) : [];
  const failed = Array.isArray(hello.failed)
    ? hello.failed.flatMap((f: unknown) => {
        const entry = f as Record<string, unknown> | null;
        return entry && Number.isInteger(entry.port)
          ? [{ port: entry.port as number, error: String(entry.error) }]
          : [];
      })
    : [];
  return { ports: ports as number[], failed, proxy: hello.proxy === true };
}

const resolver = new Resolver({ timeout: 3000, tries: 2 });

/**
 * Addresses of `host`: an IP literal is itself, host.hostd.internal is the host's loopback,
 * anything else asks DNS for A and AAAA records (IPv4 first).
 */
export async function resolveWithDns(host: string): Promise<string[]> {
  if (isIP(host)) return [host];
  if (host === HOST_ALIAS) return ['127.0.0.1'];
  const [v4, v6] = await Promise.allSettled([resolver.resolve4(host), resolver.resolve6(host)]);
  const addresses = [
    ...(v4.status === 'fulfilled' ? v4.value : []),
    ...(v6.status === 'fulfilled' ? v6.value : []),
  ];
  if (addresses.length === 0) throw v4.status === 'rejected' ? v4.reason : new Error('no address');
  return addresses;
}

function samePorts(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((port, i) => port === b[i]);
}
