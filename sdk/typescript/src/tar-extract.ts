/**
 * Unpacks a tar stream from a sandbox into a local directory. The sandbox runs untrusted code,
 * so its archive is untrusted too: nothing may land outside the directory. Entries with an
 * absolute path or a `..` component are refused, nothing is ever written through a symlink
 * (every parent is checked, and files are opened with O_NOFOLLOW after removing what was
 * there), hard links must point at a file extracted inside the directory, permissions lose
 * their setuid, setgid and sticky bits, and devices and FIFOs are skipped. Symlinks themselves
 * are recreated as they are, like `tar` and `docker cp` do: a link is harmless until something
 * writes through it, and this code never does.
 */
import { constants } from 'node:fs';
import { chmod, link, lstat, mkdir, open, symlink, unlink, utimes } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { HostdError } from './errors.js';
import { readTar } from './tar-read.js';

/** A tar entry that would escape the directory or overwrite what it must not. */
export class UnsafeArchiveError extends HostdError {
  static override readonly errorCode: string = 'unsafe_archive';
}

/** What an extraction wrote: regular files (hard links included) and their bytes. */
export interface ExtractStats {
  files: number;
  size: number;
}

const WRITE_NEW = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/**
 * Extracts `source` into `destDir` (created if missing). Directory permissions are applied last,
 * deepest first, so that a read-only directory does not stop its own contents being written.
 * On failure, what was extracted so far stays.
 */
export async function extractTar(
  source: AsyncIterable<Buffer>,
  destDir: string,
): Promise<ExtractStats> {
  const root = resolve(destDir);
  await mkdir(root, { recursive: true });
  const stats: ExtractStats = { files: 0, size: 0 };
  const dirModes: Array<[string, number]> = [];
  for await (const entry of readTar(source)) {
    const parts = safeParts(entry.path);
    if (parts.length === 0) continue; // the directory itself
    const target = join(root, ...parts);
    await makeParents(root, parts);
    const existing = await lstat(target).catch(() => undefined);
    if (entry.type === 'dir') {
      if (existing && !existing.isDirectory()) await unlink(target);
      if (!existing?.isDirectory()) await mkdir(target, { mode: 0o700 });
      dirModes.push([target, (entry.mode & 0o777) | 0o700]);
      continue;
    }
    if (entry.type === 'other') continue;
    if (existing?.isDirectory()) {
      throw new UnsafeArchiveError(`tar entry ${entry.path} would replace a directory`);
    }
    if (existing) await unlink(target);
    if (entry.type === 'symlink') {
      await symlink(entry.linkpath, target);
    } else if (entry.type === 'hardlink') {
      const source = join(root, ...safeParts(entry.linkpath));
      await makeParents(root, safeParts(entry.linkpath));
      const st = await lstat(source).catch(() => undefined);
      if (!st?.isFile()) {
        throw new UnsafeArchiveError(
          `tar entry ${entry.path} links to ${entry.linkpath}, which is not a file extracted here`,
        );
      }
      await link(source, target);
      stats.files += 1;
    } else {
      const file = await open(target, WRITE_NEW, 0o600);
      await pipeline(Readable.from(entry.body), file.createWriteStream());
      await chmod(target, entry.mode & 0o777);
      const mtime = new Date(entry.mtimeMs);
      await utimes(target, mtime, mtime);
      stats.files += 1;
      stats.size += entry.size;
    }
  }
  for (const [dir, mode] of dirModes.reverse()) await chmod(dir, mode);
  return stats;
}

/** The entry's path as components, or UnsafeArchiveError for one that could leave the root. */
function safeParts(path: string): string[] {
  if (path.startsWith('/') || path.includes('\0')) {
    throw new UnsafeArchiveError(`tar entry ${JSON.stringify(path)} has an absolute path`);
  }
  const parts = path.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) {
    throw new UnsafeArchiveError(`tar entry ${JSON.stringify(path)} leaves its directory`);
  }
  return parts;
}

/** Creates the parents of `parts` under `root`, refusing any that is a symlink or a file. */
async function makeParents(root: string, parts: string[]): Promise<void> {
  let dir = root;
  for (const part of parts.slice(0, -1)) {
    dir = join(dir, part);
    const st = await lstat(dir).catch(() => undefined);
    if (st === undefined) {
      await mkdir(dir, { mode: 0o755 });
    } else if (!st.isDirectory()) {
      throw new UnsafeArchiveError(
        `tar entry under ${JSON.stringify(part)} would be written through a ${st.isSymbolicLink() ? 'symlink' : 'file'}`,
      );
    }
  }
}
