/**
 * Reading files in directories a (possibly compromised) QEMU can write to, as a more
 * privileged hostd: never follow a symlink it planted, read only regular files, and never more
 * than a bound, so a swapped file cannot make hostd leak /etc/shadow or read /dev/zero forever;
 * and writing small records so that they survive a power cut whole or not at all.
 */
import { constants } from 'node:fs';
import { open, rename } from 'node:fs/promises';

/** The last `maxBytes` of a regular file, or '' when it is missing or not a regular file. */
export async function readTail(path: string, maxBytes: number): Promise<Buffer> {
  let fh;
  try {
    fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch {
    // Expected: no such file yet (a VM that wrote nothing), or a link (O_NOFOLLOW refuses it).
    return Buffer.alloc(0);
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) return Buffer.alloc(0);
    const length = Math.min(st.size, maxBytes);
    const buf = Buffer.alloc(length);
    const { bytesRead } = await fh.read(buf, 0, length, st.size - length);
    return buf.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}

/** The whole regular file, refusing links, other file types and anything over `maxBytes`. */
export async function readBounded(path: string, maxBytes: number): Promise<Buffer> {
  const fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new Error(`${path} is not a regular file`);
    if (st.size > maxBytes) throw new Error(`${path} is larger than ${maxBytes} bytes`);
    return await fh.readFile();
  } finally {
    await fh.close();
  }
}

/** Empties a regular file that grew past `maxBytes` (its writer appends, so it goes on). */
export async function truncateIfOver(path: string, maxBytes: number): Promise<void> {
  let fh;
  try {
    fh = await open(path, constants.O_WRONLY | constants.O_NOFOLLOW);
  } catch {
    // Expected: no such file yet, or a link (O_NOFOLLOW refuses it): nothing to truncate.
    return;
  }
  try {
    const st = await fh.stat();
    if (st.isFile() && st.size > maxBytes) await fh.truncate(0);
  } finally {
    await fh.close();
  }
}

/** Writes `data` to `path` (via a temporary name) and makes it durable before returning. */
export async function writeDurably(path: string, data: Buffer): Promise<void> {
  const tmp = `${path}.tmp`;
  const fh = await open(tmp, 'w', 0o640);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}

/** Makes a file written by someone else (QEMU, a stream) durable before it is published. */
export async function syncFile(path: string): Promise<void> {
  const fh = await open(path, 'r+');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
