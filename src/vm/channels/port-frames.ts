/**
 * Binary framing of the `hostd.files` and `hostd.net` ports, host side (the guest's is
 * guest/agent/port_frames.py; guest/PROTOCOL.md, "Framed ports"). File contents and TCP
 * streams travel as raw bytes: each frame is a 9-byte header (kind, id, payload length;
 * big-endian) and the payload, and JSON is used only in control frames.
 *
 * Everything read here comes from the guest, where root may write anything to the port: the
 * parser bounds every length, and a frame that cannot be valid makes it stop until the next
 * resynchronisation (`awaitSync`) instead of throwing.
 */
import { randomBytes } from 'node:crypto';

export const HEADER_BYTES = 9;
/** Longest payload the host sends; the guest reader refuses longer ones. */
export const MAX_TO_GUEST_PAYLOAD = 32 * 1024;
/** Starts the host's hello; never sent anywhere else (payloads are never scanned for it). */
export const SYNC = Buffer.from('ff013f14365cddbe8fa23fee4b39adeb', 'hex');
/** Starts the guest's answer to a hello. */
export const SYNC_REPLY = Buffer.from('ff3353f7a29f6b44d2c46811a8dce4e5', 'hex');

/** Frame kinds (ASCII letters, so a hex dump of the port reads): guest/PROTOCOL.md. */
export const Kind = {
  json: 0x4a,
  data: 0x44,
  end: 0x45,
  open: 0x4f,
  close: 0x43,
  credit: 0x4b,
} as const;

/** A header alone, so that a large payload is written after it without being copied. */
export function frameHeader(kind: number, id: number, length: number): Buffer {
  const header = Buffer.allocUnsafe(HEADER_BYTES);
  header.writeUInt8(kind, 0);
  header.writeUInt32BE(id, 1);
  header.writeUInt32BE(length, 5);
  return header;
}

export function encodeFrame(kind: number, id: number, payload?: Uint8Array): Buffer {
  const header = frameHeader(kind, id, payload?.length ?? 0);
  return payload?.length ? Buffer.concat([header, payload]) : header;
}

export function jsonFrame(id: number, msg: Record<string, unknown>): Buffer {
  return encodeFrame(Kind.json, id, Buffer.from(JSON.stringify(msg)));
}

/**
 * A hello that the guest finds whatever state it is in: a restored VM, or a guest whose previous
 * host vanished, may be inside a frame that will never be finished. The zero padding completes
 * any such frame (no payload is longer than MAX_TO_GUEST_PAYLOAD, and a torn header can only
 * read a smaller length); zero bytes where a frame would start are skipped as padding; then
 * SYNC resets the guest's reader. Costs ~32 KiB per hello, so hellos are sent when needed.
 */
export function helloBytes(nonce: string, fields: Record<string, unknown> = {}): Buffer {
  return Buffer.concat([
    Buffer.alloc(MAX_TO_GUEST_PAYLOAD + HEADER_BYTES),
    SYNC,
    jsonFrame(0, { ...fields, op: 'hello', nonce }),
  ]);
}

/** Random, so that the answer to an older hello (still in flight) never passes for this one's. */
export function newNonce(): string {
  return randomBytes(8).toString('hex');
}

/** What a FrameParser delivers. Callbacks may call the parser's awaitSync(). */
export interface FrameSink {
  /** A complete frame of any kind but data (data too with `wholeData`); JSON payloads are still bytes here. */
  frame(kind: number, id: number, payload: Buffer): void;
  /** A piece of a data frame's payload, as it arrives (a view of the socket's chunk). */
  data(id: number, piece: Buffer): void;
  /** The guest answered the hello awaited with awaitSync(); frames follow. */
  synced(hello: Record<string, unknown>): void;
  /** The guest sent something no valid guest sends; the parser is deaf until awaitSync(). */
  broken(reason: string): void;
}

/** What a guest may send on a port; anything beyond is a protocol error, not a big buffer. */
export interface FrameLimits {
  /** Kinds the guest may send on this port. */
  readonly kinds: ReadonlySet<number>;
  readonly maxData: number;
  /** Longest payload of every other kind. */
  readonly maxControl: number;
  /**
   * Deliver data frames whole, through `frame`, instead of piece by piece through `data`: for
   * a port whose data frames begin with a header of their own (hostd.proc: the output stream).
   */
  readonly wholeData?: boolean;
}

interface PartialFrame {
  kind: number;
  id: number;
  remaining: number;
  parts: Buffer[];
}

/** Frames out of the byte stream read from one port. */
export class FrameParser {
  private mode: 'sync' | 'hello' | 'frames' | 'broken' = 'broken';
  private nonce = '';
  private tail: Buffer = Buffer.alloc(0);
  private readonly header = Buffer.alloc(HEADER_BYTES);
  private headerFill = 0;
  private current: PartialFrame | null = null;

  constructor(
    private readonly sink: FrameSink,
    private readonly limits: FrameLimits,
  ) {}

  /** Everything up to the guest's answer to the hello carrying `nonce` is discarded. */
  awaitSync(nonce: string): void {
    this.startOver('sync');
    this.nonce = nonce;
  }

  /**
   * The stream is at a frame boundary now, with no hello to wait for: the guest said so itself
   * (NetChannel.acceptQuiet) and has sent nothing yet.
   */
  assumeInSync(): void {
    this.startOver('frames');
  }

  /** Forgets every partial frame and scan, and reads on in `mode`. */
  private startOver(mode: 'sync' | 'frames'): void {
    this.mode = mode;
    this.tail = Buffer.alloc(0);
    this.headerFill = 0;
    this.current = null;
  }

  push(chunk: Buffer): void {
    let off = 0;
    while (off < chunk.length) {
      if (this.mode === 'broken') return;
      if (this.mode === 'sync') {
        const found = this.scan(chunk, off);
        if (found < 0) return;
        off = found;
        this.mode = 'hello';
        continue;
      }
      if (this.current === null) {
        const n = Math.min(HEADER_BYTES - this.headerFill, chunk.length - off);
        chunk.copy(this.header, this.headerFill, off, off + n);
        this.headerFill += n;
        off += n;
        if (this.headerFill < HEADER_BYTES) return;
        this.headerFill = 0;
        this.startFrame();
        continue;
      }
      const frame = this.current;
      const n = Math.min(frame.remaining, chunk.length - off);
      const piece = chunk.subarray(off, off + n);
      off += n;
      frame.remaining -= n;
      if (frame.kind === Kind.data && this.mode === 'frames' && !this.limits.wholeData) {
        this.sink.data(frame.id, piece);
      } else frame.parts.push(piece);
      if (frame.remaining === 0) this.endFrame(frame);
    }
  }

  /** Looks for SYNC_REPLY from `off`; returns the offset just past it, or -1. */
  private scan(chunk: Buffer, off: number): number {
    const rest = chunk.subarray(off);
    const hay = this.tail.length ? Buffer.concat([this.tail, rest]) : rest;
    const at = hay.indexOf(SYNC_REPLY);
    if (at < 0) {
      this.tail = Buffer.from(hay.subarray(Math.max(0, hay.length - SYNC_REPLY.length + 1)));
      return -1;
    }
    const end = off + at + SYNC_REPLY.length - this.tail.length;
    this.tail = Buffer.alloc(0);
    return end;
  }

  private startFrame(): void {
    const kind = this.header.readUInt8(0);
    const id = this.header.readUInt32BE(1);
    const length = this.header.readUInt32BE(5);
    const max = kind === Kind.data ? this.limits.maxData : this.limits.maxControl;
    if (this.mode === 'hello' && (kind !== Kind.json || length > this.limits.maxControl)) {
      this.mode = 'sync'; // not the hello's answer after all: keep looking
      return;
    }
    if (!this.limits.kinds.has(kind) || length > max) {
      this.fail(`a frame of kind ${kind} and length ${length}`);
      return;
    }
    this.current = { kind, id, remaining: length, parts: [] };
    if (length === 0) this.endFrame(this.current);
  }

  private endFrame(frame: PartialFrame): void {
    this.current = null;
    if (this.mode === 'hello') {
      this.mode = 'sync';
      const msg = parseJsonObject(Buffer.concat(frame.parts));
      if (msg?.op === 'hello' && msg.nonce === this.nonce) {
        this.mode = 'frames';
        this.sink.synced(msg);
      }
      return;
    }
    if (frame.kind !== Kind.data || this.limits.wholeData) {
      this.sink.frame(frame.kind, frame.id, Buffer.concat(frame.parts));
    }
  }

  private fail(reason: string): void {
    this.mode = 'broken';
    this.current = null;
    this.sink.broken(reason);
  }
}

/** A JSON object from the guest, or null for anything else. Never throws. */
export function parseJsonObject(payload: Buffer): Record<string, unknown> | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(payload.toString('utf8'));
  } catch {
    return null;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return null;
  return parsed as Record<string, unknown>;
}

/**
 * The hello a framed port's host side sends before its first request, and again after anything
 * that leaves the guest's side unknown (a restore, a protocol error, a timeout): requests may go
 * right behind it, and the parser drops whatever the guest sent before its answer. The files
 * and processes channels share it; the net channel says hello once per connection of its own.
 */
export class HelloHandshake {
  private state: 'none' | 'sent' | 'answered' = 'none';
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly parser: FrameParser,
    private readonly version: number,
    private readonly timeoutMs: number,
    /** The guest did not answer in time; the next request says hello again. */
    private readonly onTimeout: () => void,
  ) {}

  /** A hello went out (answered or not): the guest may hold state of this channel's ids. */
  get started(): boolean {
    return this.state !== 'none';
  }

  /** Request `msg` of `id` as frames to write, behind a hello when none is outstanding. */
  requestFrames(id: number, msg: Record<string, unknown>): Buffer[] {
    const frames: Buffer[] = [];
    if (this.state === 'none') {
      const nonce = newNonce();
      this.state = 'sent';
      this.parser.awaitSync(nonce);
      this.timer = setTimeout(() => {
        this.timer = null;
        this.state = 'none';
        this.onTimeout();
      }, this.timeoutMs);
      frames.push(helloBytes(nonce, { version: this.version }));
    }
    frames.push(jsonFrame(id, msg));
    return frames;
  }

  /** The parser saw the guest's answer (FrameSink.synced). */
  answered(): void {
    this.clearTimer();
    this.state = 'answered';
  }

  /** The guest's side is unknown again: the next request starts with a new hello. */
  reset(): void {
    this.clearTimer();
    this.state = 'none';
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}
