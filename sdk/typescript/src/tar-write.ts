/**
 * Writes a local directory as a tar stream (POSIX ustar, with a PAX header for the names and
 * sizes ustar cannot hold), one file at a time as it is read, so an upload never holds a whole
 * file. Hand-written rather than a tar package: these ~150 lines are all `uploadDir` needs, and
 * the SDK keeps no runtime dependencies.
 */
import { createReadStream } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import { join } from 'node:path';

const BLOCK = 512;
/** Largest size a ustar size field holds: eleven octal digits. */
const MAX_USTAR_SIZE = 0o77777777777;

export interface TarHeader {
  /** Relative, `/`-separated; directories without a trailing slash. */
  path: string;
  type: 'file' | 'dir' | 'symlink';
  size: number;
  mode: number;
  mtimeMs: number;
  linkpath?: string;
}

const TYPE_FLAGS = { file: '0', dir: '5', symlink: '2' } as const;

/** The header blocks of one entry: a PAX header first when ustar fields cannot hold it. */
export function headerBlocks(h: TarHeader): Buffer {
  const name = h.type === 'dir' ? `${h.path}/` : h.path;
  const linkpath = h.linkpath ?? '';
  const pax: Record<string, string> = {};
  if (!fitsUstar(name)) pax.path = name;
  if (!fitsUstar(linkpath)) pax.linkpath = linkpath;
  if (h.size > MAX_USTAR_SIZE) pax.size = String(h.size);
  const ustar = ustarBlock({
    name: pax.path === undefined ? name : name.slice(-100).replace(/[^\x20-\x7e]/g, '_'),
    mode: h.mode & 0o7777,
    size: h.size > MAX_USTAR_SIZE ? 0 : h.size,
    mtimeS: Math.floor(h.mtimeMs / 1000),
    typeflag: TYPE_FLAGS[h.type],
    linkname: pax.linkpath === undefined ? linkpath : '',
  });
  if (Object.keys(pax).length === 0) return ustar;
  const records = Buffer.from(Object.entries(pax).map(paxRecord).join(''), 'utf8');
  const paxHeader = ustarBlock({
    name: 'PaxHeader',
    mode: 0o644,
    size: records.length,
    mtimeS: Math.floor(h.mtimeMs / 1000),
    typeflag: 'x',
    linkname: '',
  });
  return Buffer.concat([paxHeader, records, padding(records.length), ustar]);
}

/** Zeros that fill the last block of `size` bytes of content. */
export function padding(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);
}

/** The end of an archive: two zero blocks. */
export const TRAILER = Buffer.alloc(2 * BLOCK);

/** ASCII and at most 100 bytes: what a ustar name field holds without help. */
function fitsUstar(value: string): boolean {
  return value.length <= 100 && /^[\x20-\x7e]*$/.test(value);
}

/** `"<length> key=value\n"`, where the length counts the whole record, its own digits too. */
function paxRecord([key, value]: [string, string]): string {
  const rest = Buffer.byteLength(` ${key}=${value}\n`);
  let length = rest + String(rest).length;
  if (String(length).length !== String(rest).length) length = rest + String(length).length;
  return `${length} ${key}=${value}\n`;
}

interface UstarFields {
  name: string;
  mode: number;
  size: number;
  mtimeS: number;
  typeflag: string;
  linkname: string;
}

function ustarBlock(f: UstarFields): Buffer {
  const b = Buffer.alloc(BLOCK);
  b.write(f.name, 0, 100, 'utf8');
  octal(b, 100, 8, f.mode);
  octal(b, 108, 8, 0); // uid: files in a sandbox belong to root anyway
  octal(b, 116, 8, 0); // gid
  octal(b, 124, 12, f.size);
  octal(b, 136, 12, f.mtimeS);
  b.write(f.typeflag, 156, 1, 'ascii');
  b.write(f.linkname, 157, 100, 'utf8');
  b.write('ustar\u000000', 257, 8, 'ascii');
  b.fill(0x20, 148, 156); // the checksum is computed with its own field as spaces
  let sum = 0;
  for (const byte of b) sum += byte;
  b.write(`${sum.toString(8).padStart(6, '0')}\u0000 `, 148, 8, 'ascii');
  return b;
}

/** A NUL-terminated octal number filling `width` bytes. */
function octal(b: Buffer, offset: number, width: number, value: number): void {
  b.write(`${value.toString(8).padStart(width - 1, '0')}\u0000`, offset, width, 'ascii');
}

/**
 * The tar stream of everything under `root` (not `root` itself), parents before children,
 * names sorted. Symlinks are stored as links, never followed; sockets, FIFOs and devices are
 * left out. A file that changes size while it is read aborts the stream.
 *
 * @example
 * await pipeline(Readable.from(tarDirectory('./data')), createWriteStream('data.tar'));
 */
export async function* tarDirectory(root: string): AsyncGenerator<Buffer> {
  for await (const { path, abs } of walk(root, '')) {
    const st = await lstat(abs);
    const common = { path, mode: st.mode, mtimeMs: st.mtimeMs };
    if (st.isDirectory()) {
      yield headerBlocks({ ...common, type: 'dir', size: 0 });
    } else if (st.isSymbolicLink()) {
      yield headerBlocks({ ...common, type: 'symlink', size: 0, linkpath: await readlink(abs) });
    } else if (st.isFile()) {
      yield headerBlocks({ ...common, type: 'file', size: st.size });
      let sent = 0;
      if (st.size > 0) {
        for await (const chunk of createReadStream(abs, { start: 0, end: st.size - 1 })) {
          sent += (chunk as Buffer).length;
          yield chunk as Buffer;
        }
      }
      if (sent !== st.size) throw new Error(`${abs} changed size while it was being uploaded`);
      yield padding(st.size);
    }
  }
  yield TRAILER;
}

/** Every entry under `dir`, depth first, parents before children, names sorted. */
async function* walk(dir: string, prefix: string): AsyncGenerator<{ path: string; abs: string }> {
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    const abs = join(dir, name);
    const path = prefix === '' ? name : `${prefix}/${name}`;
    yield { path, abs };
    if ((await lstat(abs)).isDirectory()) yield* walk(abs, path);
  }
}
