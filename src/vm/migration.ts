/**
 * Feeding a saved device state into a QEMU waiting with `-incoming defer`. QEMU runs under
 * `-sandbox spawn=deny`, so the `exec:cat` migration URI of NOTES.md is not available; hostd
 * connects to QEMU's incoming unix socket and writes the bytes itself.
 */
import { connect } from 'node:net';

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
