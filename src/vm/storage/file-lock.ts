/**
 * An exclusive lock on a file that other processes honour too (hostd, `npm run template`, the
 * image scripts all build into one cache). Node has no flock(2), so a child `flock` process
 * takes the lock and holds it until its stdin closes: when we release it, or when this process
 * dies, so a crashed builder never leaves a stale lock.
 */
import { spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';

/**
 * Runs `fn` while holding the lock on `path` (created if missing), waiting for another holder
 * first. The `flock` command comes from util-linux (scripts/host-packages).
 *
 * @example await withFileLock('/var/cache/hostd/templates/python.lock', () => build());
 */
export async function withFileLock<T>(path: string, fn: () => Promise<T>): Promise<T> {
  await mkdir(dirname(path), { recursive: true });
  // Once flock holds the lock it runs the command: say so, then wait for our stdin to close.
  const holder = spawn('flock', ['--exclusive', path, 'sh', '-c', 'echo locked && exec cat'], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  holder.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  await new Promise<void>((resolve, reject) => {
    const fail = (why: string): void => {
      reject(new Error(`cannot lock ${path}: ${why}${stderr ? `: ${stderr.trim()}` : ''}`));
    };
    holder.once('error', (err) => fail(err.message));
    holder.once('exit', (code) => fail(`flock exited with ${code}`));
    holder.stdout.once('data', () => {
      holder.removeAllListeners('exit');
      resolve();
    });
  });
  const released = new Promise<void>((resolve) => holder.once('exit', () => resolve()));
  try {
    return await fn();
  } finally {
    holder.stdin.end();
    await released;
  }
}
