/**
 * Moving migration streams between QEMU and hostd memory over unix sockets. QEMU runs under
 * `-sandbox spawn=deny`, so the `exec:cat` migration URIs of NOTES.md are not available;
 * a unix socket served by hostd does the same job without letting QEMU start processes.
 */
import { createServer, connect } from 'node:net';
import { rm } from 'node:fs/promises';

/**
 * Listens on `path`, collects everything the single client sends until it closes, and
 * resolves with it. Returns `ready` (listening) and `done` (the whole stream).
 */
export async function receiveStream(
  path: string,
  timeoutMs: number,
): Promise<{ done: Promise<Buffer>; close: () => void }> {
  await rm(path, { force: true });
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  const close = (): void => {
    server.close();
    void rm(path, { force: true });
  };
  const done = new Promise<Buffer>((resolve, reject) => {
    const timer = setTimeout(() => {
      close();
      reject(new Error(`no complete migration stream on ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    server.once('connection', (socket) => {
      const chunks: Buffer[] = [];
      socket.on('data', (c: Buffer) => chunks.push(c));
      socket.on('error', () => undefined);
      socket.on('close', () => {
        clearTimeout(timer);
        close();
        resolve(Buffer.concat(chunks));
      });
    });
  });
  return { done, close };
}

/** Connects to a QEMU listening for an incoming migration and writes `data` to it. */
export function sendStream(path: string, data: Buffer, deadline: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const attempt = (): void => {
      const socket = connect(path);
      socket.once('connect', () => {
        socket.end(data, () => resolve());
      });
      socket.once('error', (err: NodeJS.ErrnoException) => {
        socket.destroy();
        if ((err.code === 'ENOENT' || err.code === 'ECONNREFUSED') && Date.now() < deadline) {
          setTimeout(attempt, 1);
        } else {
          reject(err);
        }
      });
    };
    attempt();
  });
}
