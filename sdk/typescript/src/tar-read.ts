/**
 * Reads a tar stream entry by entry as its bytes arrive, so a download never holds a whole
 * file: ustar, PAX (`x` and `g` headers) and GNU long names (`L`, `K`), numbers in octal or
 * GNU base-256. What the entries mean for the local disk is tar-extract.ts's business.
 */

import { HostdError } from './errors.js';

const BLOCK = 512;

export interface TarEntry {
  /** As the archive names it (long names applied); not yet checked for safety. */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'hardlink' | 'other';
  size: number;
  mode: number;
  mtimeMs: number;
  linkpath: string;
  /**
   * The content, as it arrives. Read it before asking for the next entry; what is left unread
   * is skipped.
   */
  body: AsyncGenerator<Buffer>;
}

/** Thrown for bytes that are not a tar stream, or one cut short: hostd sent something wrong. */
export class TarFormatError extends HostdError {}

/** Pulls exact byte counts out of a stream of chunks of any size. */
class ByteSource {
  readonly #chunks: AsyncIterator<Buffer>;
  #buffered: Buffer = Buffer.alloc(0);
  #ended = false;

  constructor(source: AsyncIterable<Buffer>) {
    this.#chunks = source[Symbol.asyncIterator]();
  }

  /** True when at least `n` bytes are buffered; false when the stream ends first. */
  async #fill(n: number): Promise<boolean> {
    while (this.#buffered.length < n && !this.#ended) {
      const next = await this.#chunks.next();
      if (next.done) this.#ended = true;
      else if (this.#buffered.length === 0) this.#buffered = next.value;
      else this.#buffered = Buffer.concat([this.#buffered, next.value]);
    }
    return this.#buffered.length >= n;
  }

  /** Exactly `n` bytes; undefined at a clean end of stream; TarFormatError when cut short. */
  async exact(n: number): Promise<Buffer | undefined> {
    if (!(await this.#fill(n))) {
      if (this.#buffered.length === 0) return undefined;
      throw new TarFormatError('the tar stream ended in the middle of a block');
    }
    const out = this.#buffered.subarray(0, n);
    this.#buffered = this.#buffered.subarray(n);
    return out;
  }

  /** Between 1 and `max` bytes, whatever is at hand first. */
  async some(max: number): Promise<Buffer> {
    if (!(await this.#fill(1))) throw new TarFormatError('the tar stream ended inside a file');
    const out = this.#buffered.subarray(0, Math.min(max, this.#buffered.length));
    this.#buffered = this.#buffered.subarray(out.length);
    return out;
  }

  async skip(n: number): Promise<void> {
    for (let left = n; left > 0;) left -= (await this.some(left)).length;
  }

  /** Stops reading the source (closes the connection it comes from). */
  async close(): Promise<void> {
    await this.#chunks.return?.();
  }
}

interface RawHeader {
  name: string;
  mode: number;
  size: number;
  mtimeS: number;
  typeflag: string;
  linkname: string;
}

/**
 * The entries of a tar stream in order. Stops at the end-of-archive blocks or the end of the
 * stream; leaving early stops reading `source`.
 *
 * @example
 * for await (const entry of readTar(response)) console.log(entry.path, entry.size);
 */
export async function* readTar(source: AsyncIterable<Buffer>): AsyncGenerator<TarEntry> {
  const bytes = new ByteSource(source);
  let global: Record<string, string> = {};
  let next: Record<string, string> = {};
  try {
    for (;;) {
      const block = await bytes.exact(BLOCK);
      if (block === undefined || block.every((b) => b === 0)) return;
      const h = parseHeader(block);
      if (h.typeflag === 'x' || h.typeflag === 'g' || h.typeflag === 'L' || h.typeflag === 'K') {
        const data = (await bytes.exact(h.size + padLength(h.size))) ?? Buffer.alloc(0);
        const content = data.subarray(0, h.size);
        if (h.typeflag === 'x') next = { ...next, ...parsePax(content) };
        else if (h.typeflag === 'g') global = { ...global, ...parsePax(content) };
        else next[h.typeflag === 'L' ? 'path' : 'linkpath'] = cString(content);
        continue;
      }
      const fields = { ...global, ...next };
      next = {};
      const size = fields.size !== undefined ? Number(fields.size) : h.size;
      const type = entryType(h.typeflag);
      // Only regular files carry content in the stream; a hard link's size is that of its target.
      const stored = type === 'file' || type === 'other' ? size : 0;
      let remaining = stored;
      const body = (async function* () {
        while (remaining > 0) {
          const chunk = await bytes.some(remaining);
          remaining -= chunk.length;
          yield chunk;
        }
      })();
      yield {
        path: fields.path ?? h.name,
        type,
        size: stored,
        mode: h.mode,
        mtimeMs: (fields.mtime !== undefined ? Number(fields.mtime) : h.mtimeS) * 1000,
        linkpath: fields.linkpath ?? h.linkname,
        body,
      };
      await body.return(undefined);
      await bytes.skip(remaining + padLength(stored));
    }
  } finally {
    await bytes.close();
  }
}

function entryType(flag: string): TarEntry['type'] {
  if (flag === '0' || flag === '\0' || flag === '7') return 'file';
  if (flag === '5') return 'dir';
  if (flag === '2') return 'symlink';
  if (flag === '1') return 'hardlink';
  return 'other';
}

function padLength(size: number): number {
  return (BLOCK - (size % BLOCK)) % BLOCK;
}

function parseHeader(b: Buffer): RawHeader {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : b[i]!;
  if (sum !== number(b, 148, 8)) throw new TarFormatError('not a tar stream (bad checksum)');
  let name = cString(b.subarray(0, 100));
  if (b.toString('ascii', 257, 262) === 'ustar') {
    const prefix = cString(b.subarray(345, 500));
    if (prefix !== '') name = `${prefix}/${name}`;
  }
  return {
    name,
    mode: number(b, 100, 8),
    size: number(b, 124, 12),
    mtimeS: number(b, 136, 12),
    typeflag: String.fromCharCode(b[156]!),
    linkname: cString(b.subarray(157, 257)),
  };
}

/** An octal field, or GNU base-256 when its first byte has the high bit set. */
function number(b: Buffer, offset: number, width: number): number {
  const field = b.subarray(offset, offset + width);
  if (field[0]! & 0x80) {
    let value = field[0]! & 0x7f;
    for (const byte of field.subarray(1)) value = value * 256 + byte;
    return value;
  }
  const text = field
    .toString('ascii')
    .replace(/[\0 ]+$/g, '')
    .trim();
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw new TarFormatError(`not a tar stream (bad number ${text})`);
  return parseInt(text, 8);
}

function cString(b: Buffer): string {
  const end = b.indexOf(0);
  return b.toString('utf8', 0, end === -1 ? b.length : end);
}

/** PAX records: `"<length> key=value\n"`, UTF-8. */
function parsePax(content: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  let at = 0;
  while (at < content.length) {
    const space = content.indexOf(0x20, at);
    const length = Number(content.toString('ascii', at, space));
    if (space === -1 || !Number.isInteger(length) || length <= 0) {
      throw new TarFormatError('not a tar stream (bad PAX record)');
    }
    const record = content.toString('utf8', space + 1, at + length - 1);
    const eq = record.indexOf('=');
    if (eq > 0) out[record.slice(0, eq)] = record.slice(eq + 1);
    at += length;
  }
  return out;
}
