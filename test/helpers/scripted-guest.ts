/**
 * The guest end of a framed port (files or net), scripted by a test: it records the frames
 * the host sends (skipping hello padding) and sends whatever the test wants, so the host
 * side can be tested against a restored, confused or hostile guest.
 */
import { once } from 'node:events';
import { createServer, type Server, type Socket } from 'node:net';
import {
  HEADER_BYTES,
  Kind,
  SYNC,
  SYNC_REPLY,
  jsonFrame,
} from '../../src/vm/channels/port-frames.js';

export interface HostFrame {
  kind: number;
  id: number;
  msg: Record<string, unknown> | null;
  payload: Buffer;
}

/** The guest end of the port, scripted by each test. */
export class ScriptedGuest {
  readonly frames: HostFrame[] = [];
  syncs = 0;
  socket!: Socket;
  private buf = Buffer.alloc(0);
  private waiters: (() => void)[] = [];

  constructor(private readonly server: Server) {}

  static async start(path: string): Promise<ScriptedGuest> {
    const server = createServer((socket) => {
      guest.socket = socket;
      socket.on('data', (chunk: Buffer) => guest.onData(chunk));
    });
    const guest = new ScriptedGuest(server);
    server.listen(path);
    await once(server, 'listening');
    return guest;
  }

  private onData(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    for (;;) {
      let start = 0;
      while (start < this.buf.length && this.buf[start] === 0) start++;
      this.buf = this.buf.subarray(start);
      if (this.buf.length >= SYNC.length && this.buf.subarray(0, SYNC.length).equals(SYNC)) {
        this.buf = this.buf.subarray(SYNC.length);
        this.syncs++;
        continue;
      }
      if (this.buf.length < HEADER_BYTES) break;
      const length = this.buf.readUInt32BE(5);
      if (this.buf.length < HEADER_BYTES + length) break;
      const payload = this.buf.subarray(HEADER_BYTES, HEADER_BYTES + length);
      const kind = this.buf[0]!;
      this.frames.push({
        kind,
        id: this.buf.readUInt32BE(1),
        msg:
          kind === Kind.json ? (JSON.parse(payload.toString()) as Record<string, unknown>) : null,
        payload: Buffer.from(payload),
      });
      this.buf = this.buf.subarray(HEADER_BYTES + length);
    }
    for (const waiter of this.waiters.splice(0)) waiter();
  }

  /** The next host frame whose JSON op is `op`, waiting for it. */
  next(op: string): Promise<HostFrame> {
    return this.nextWhere((f) => f.msg?.op === op);
  }

  /** The next host frame of `kind` (for connection `id`), waiting for it. */
  nextOfKind(kind: number, id?: number): Promise<HostFrame> {
    return this.nextWhere((f) => f.kind === kind && (id === undefined || f.id === id));
  }

  async nextWhere(match: (frame: HostFrame) => boolean): Promise<HostFrame> {
    for (;;) {
      const index = this.frames.findIndex(match);
      if (index >= 0) return this.frames.splice(index, 1)[0]!;
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
  }

  send(...parts: Buffer[]): void {
    this.socket.write(Buffer.concat(parts));
  }

  helloReply(nonce: unknown): Buffer {
    return Buffer.concat([SYNC_REPLY, jsonFrame(0, { op: 'hello', nonce, version: 1 })]);
  }

  close(): void {
    this.socket?.destroy();
    this.server.close();
  }
}
