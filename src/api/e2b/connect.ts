/**
 * The Connect protocol (connectrpc.com/docs/protocol) as E2B's SDKs speak it to envd, with the
 * JSON codec (docs/e2b.md, "envd"):
 *
 * - unary calls: `POST /<pkg>.<Service>/<Method>`, `application/json` both ways, errors as a
 *   non-200 status with `{"code", "message"}` (errors.ts, sendConnectError);
 * - server-streaming calls: the request is one enveloped message (`application/connect+json`:
 *   a flag byte, a 4-byte big-endian length, the JSON), the answer is HTTP 200 and a sequence of
 *   envelopes, the last of them flagged end-stream (0x02) and carrying `{}` or `{"error"}`: a
 *   streaming call's errors, even one refused at once, travel in that last envelope, not in the
 *   status;
 * - `Connect-Timeout-Ms` bounds a stream (envd makes it a command's lifetime, too), and
 *   `Keepalive-Ping-Interval` (seconds, envd's extension) asks for an empty message whenever the
 *   stream was silent that long, so proxies and the client's body timeout do not cut it.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { fail, HostdError, toHostdError } from '../../errors.js';
import { connectErrorJson } from './errors.js';

export const UNARY_TYPE = 'application/json';
export const STREAM_TYPE = 'application/connect+json';

const FLAG_COMPRESSED = 0x01;
const FLAG_END_STREAM = 0x02;
/** envd's default when the client asks for no keepalive interval (permissions/keepalive.go). */
const DEFAULT_KEEPALIVE_S = 90;
/** Connect's limit on Connect-Timeout-Ms: at most 10 digits. */
const TIMEOUT_PATTERN = /^\d{1,10}$/;

type Message = Record<string, unknown>;

function header(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** One envelope: flags, big-endian length, the JSON of `msg`. */
export function envelope(msg: unknown, flags = 0): Buffer {
  const json = Buffer.from(JSON.stringify(msg));
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** The request message of a unary call: a JSON object (an empty body is `{}`). */
export function unaryRequest(req: FastifyRequest): Message {
  const type = (header(req, 'content-type') ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== UNARY_TYPE) throw fail('unsupportedMediaType', UNARY_TYPE);
  const body = req.body ?? {};
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw fail('bodyNotObject', 'the request message');
  }
  return body as Message;
}

/** The one enveloped request message of a server-streaming call. */
export function streamRequest(req: FastifyRequest): Message {
  const type = (header(req, 'content-type') ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== STREAM_TYPE) throw fail('unsupportedMediaType', STREAM_TYPE);
  const body = req.body;
  if (!Buffer.isBuffer(body) || body.length < 5) {
    throw fail('malformedRequest', 'a streaming request is one enveloped message');
  }
  const flags = body.readUInt8(0);
  const length = body.readUInt32BE(1);
  if (flags & FLAG_COMPRESSED) {
    throw fail('malformedRequest', 'compressed envelopes are not accepted');
  }
  if (body.length !== 5 + length) {
    throw fail('malformedRequest', 'the envelope length does not match the body');
  }
  let msg: unknown;
  try {
    msg = JSON.parse(body.subarray(5).toString('utf8'));
  } catch (err) {
    throw fail('bodyNotJson', (err as Error).message);
  }
  if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) {
    throw fail('bodyNotObject', 'the request message');
  }
  return msg as Message;
}

/** Answers a unary call. */
export function sendUnary(reply: FastifyReply, msg: Message): FastifyReply {
  return reply.code(200).type(UNARY_TYPE).send(msg);
}

/** `Connect-Timeout-Ms`, when the client sent one (0 or absent: no deadline). */
export function timeoutOf(req: FastifyRequest): number {
  const value = header(req, 'connect-timeout-ms')?.trim();
  if (value === undefined || value === '') return 0;
  if (!TIMEOUT_PATTERN.test(value))
    throw fail('invalidField', 'Connect-Timeout-Ms', 'milliseconds', value);
  return Number(value);
}

/** `Keepalive-Ping-Interval` in ms: envd's 90 s when absent or not an integer. */
function keepaliveOf(req: FastifyRequest): number {
  const value = header(req, 'keepalive-ping-interval')?.trim() ?? '';
  const seconds =
    /^\d{1,6}$/.test(value) && Number(value) > 0 ? Number(value) : DEFAULT_KEEPALIVE_S;
  return seconds * 1000;
}

export interface StreamOptions {
  /** The empty message sent when the stream was silent for the keepalive interval. */
  readonly keepalive: Message;
  /** What the deadline bounds, for its error message (`the command`, `the watch`). */
  readonly what: string;
}

/**
 * The answer of a server-streaming call. Its head goes out at once (so the client's header
 * timeout never fires on a long silence); `send` writes a message with backpressure; `end`
 * writes the end-stream envelope, with the error if any. `signal` aborts when the client went
 * away or the deadline passed (then the stream has already ended with `deadline_exceeded`).
 */
export class ServerStream {
  private readonly controller = new AbortController();
  private ended = false;
  private keepaliveTimer: NodeJS.Timeout | null = null;
  private deadlineTimer: NodeJS.Timeout | null = null;
  private readonly keepaliveMs: number;
  /** The client's deadline in ms (0: none): envd makes it a command's lifetime too. */
  readonly timeoutMs: number;

  constructor(
    req: FastifyRequest,
    private readonly reply: FastifyReply,
    private readonly options: StreamOptions,
  ) {
    this.keepaliveMs = keepaliveOf(req);
    let timeoutMs = 0;
    let badTimeout: HostdError | null = null;
    try {
      timeoutMs = timeoutOf(req);
    } catch (err) {
      badTimeout = toHostdError(err, req.id);
    }
    this.timeoutMs = timeoutMs;
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': STREAM_TYPE, 'cache-control': 'no-store' });
    res.flushHeaders();
    res.on('close', () => {
      this.clearTimers();
      if (!this.ended) this.controller.abort(fail('requestAborted', 'while its stream was open'));
    });
    if (badTimeout) {
      this.end(badTimeout);
      return;
    }
    if (timeoutMs > 0) {
      this.deadlineTimer = setTimeout(() => {
        this.end(fail('deadlineExceeded', options.what, timeoutMs));
      }, timeoutMs);
    }
    this.armKeepalive();
  }

  /** Aborts when the client went away or the stream ended early (the deadline). */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get open(): boolean {
    return !this.ended && !this.reply.raw.destroyed;
  }

  /** Writes one message; resolves when the socket can take more. */
  async send(msg: Message): Promise<void> {
    if (!this.open) return;
    this.armKeepalive();
    const res = this.reply.raw;
    if (!res.write(envelope(msg))) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          res.off('drain', done);
          res.off('close', done);
          resolve();
        };
        res.on('drain', done);
        res.on('close', done);
      });
    }
  }

  /** Ends the stream: `{}`, or `{"error": ...}` for `err`. Later calls do nothing. */
  end(err?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.clearTimers();
    const res = this.reply.raw;
    if (!res.destroyed) {
      const trailer =
        err === undefined ? {} : { error: connectErrorJson(err, this.reply.request.id) };
      res.end(envelope(trailer, FLAG_END_STREAM));
    }
    // What still runs for this stream stops (its run is detached by the route)
    this.controller.abort(err instanceof HostdError ? err : fail('requestAborted', 'stream over'));
  }

  private armKeepalive(): void {
    if (this.keepaliveTimer) clearTimeout(this.keepaliveTimer);
    this.keepaliveTimer = setTimeout(() => {
      this.keepaliveTimer = null;
      void this.send(this.options.keepalive);
    }, this.keepaliveMs);
    this.keepaliveTimer.unref();
  }

  private clearTimers(): void {
    if (this.keepaliveTimer) clearTimeout(this.keepaliveTimer);
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    this.keepaliveTimer = this.deadlineTimer = null;
  }
}
