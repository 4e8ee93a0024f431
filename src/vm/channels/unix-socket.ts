/**
 * Unix-socket plumbing shared by every channel to a QEMU process (QMP, the guest agent's ports,
 * the device-state stream): connecting to a socket the process is about to create, and reading
 * newline-delimited lines with a cap. QEMU and the guest are untrusted: a peer that never sends a
 * newline must cost bounded memory and linear time.
 */
import { connect, type Socket } from 'node:net';

/**
 * Connects to a unix socket that a just-spawned process is about to create (QEMU makes its
 * sockets a few ms after exec), retrying every 2 ms until `deadline` (epoch ms).
 */
export async function connectWithRetry(path: string, deadline: number): Promise<Socket> {
  for (;;) {
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const socket = connect(path);
        socket.once('connect', () => {
          socket.removeAllListeners('error');
          resolve(socket);
        });
        socket.once('error', (err) => {
          socket.destroy();
          reject(err);
        });
      });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if ((code !== 'ENOENT' && code !== 'ECONNREFUSED') || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 2));
    }
  }
}

/** Connects (with retry) to `path`, writes `data` and closes: e.g. a device state into QEMU. */
export async function sendAll(path: string, data: Buffer, deadline: number): Promise<void> {
  const socket = await connectWithRetry(path, deadline);
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.end(data, () => resolve());
  });
}

/**
 * Splits a socket's bytes into lines (without the newline) for `onLine`. A line longer than
 * `maxLine` characters is dropped whole, up to its newline, and reported to `onOversized`.
 */
export class LineReader {
  private buffer = '';
  private skipping = false;

  constructor(
    readonly socket: Socket,
    private readonly onLine: (line: string) => void,
    private readonly maxLine: number,
    private readonly onOversized: () => void = () => undefined,
  ) {
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => this.onData(chunk));
    socket.on('error', () => undefined);
  }

  write(data: string): void {
    this.socket.write(data);
  }

  private onData(chunk: string): void {
    let start = 0;
    if (this.skipping) {
      const nl = chunk.indexOf('\n');
      if (nl < 0) return;
      this.skipping = false;
      start = nl + 1;
    }
    // Only the new chunk can hold a newline the old buffer did not: scan from there, so a
    // peer sending one endless line costs linear, not quadratic, time.
    let from = this.buffer.length;
    this.buffer += start === 0 ? chunk : chunk.slice(start);
    let lineStart = 0;
    for (let nl = this.buffer.indexOf('\n', from); nl >= 0; nl = this.buffer.indexOf('\n', from)) {
      this.onLine(this.buffer.slice(lineStart, nl));
      lineStart = from = nl + 1;
    }
    this.buffer = lineStart === 0 ? this.buffer : this.buffer.slice(lineStart);
    if (this.buffer.length > this.maxLine) {
      this.buffer = '';
      this.skipping = true;
      this.onOversized();
    }
  }
}

/** Parses one line of JSON into an object; null for anything else (never throws). */
export function parseJsonObject(line: string): Record<string, unknown> | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return null;
  }
  return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
    ? (parsed as Record<string, unknown>)
    : null;
}
