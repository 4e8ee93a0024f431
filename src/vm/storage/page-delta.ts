/**
 * Finds and copies the guest RAM pages a clone has written since it was restored.
 *
 * A clone maps its base image privately, so the kernel gives it an anonymous copy of every page
 * it writes and leaves every other page a page of the base file. `/proc/PID/pagemap` tells the
 * two apart (bit 61: file page); `/proc/PID/mem` reads the anonymous ones. Copying the base file
 * plus these pages reproduces the clone's RAM exactly, at the cost of the pages written rather
 * than of the whole RAM (QEMU's own migration copies all of it, at about 100 MB/s under TCG).
 */
import { closeSync, fstatSync, openSync, readSync, writeSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';
import { VmError } from '../vm-error.js';
import type { ZeroPages } from './zero-pages.js';

const PAGE = 4096;
// Flags in the high 32-bit half of a pagemap entry (bits 63, 62, 61 of the 64-bit entry).
const PRESENT = 1 << 31;
const SWAPPED = 1 << 30;
const FILE_OR_SHARED = 1 << 29;
/** Bytes copied between two yields to the event loop. */
const SLICE_BYTES = 8 * 1024 * 1024;
/** Bytes read from guest RAM at a time (and so the most a sink gets in one call). */
const CHUNK_BYTES = 4 * 1024 * 1024;

/**
 * Start address of the mapping of `path` of exactly `bytes` in process `pid`. Matched by the
 * file (device and inode), not its name: a jailed QEMU mapped it by its view's name
 * (vm/host/vm-view.ts), gone since.
 */
export async function findMapping(pid: number, path: string, bytes: number): Promise<bigint> {
  const [maps, file] = await Promise.all([readFile(`/proc/${pid}/maps`, 'utf8'), stat(path)]);
  // The device as maps prints it: the kernel's major and minor numbers in hex.
  const d = BigInt(file.dev);
  const major = ((d >> 8n) & 0xfffn) | ((d >> 32n) & ~0xfffn);
  const minor = (d & 0xffn) | ((d >> 12n) & ~0xffn);
  const dev = `${major.toString(16).padStart(2, '0')}:${minor.toString(16).padStart(2, '0')}`;
  for (const line of maps.split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ (\S+) (\d+)/.exec(line);
    if (!m || m[3] !== dev || Number(m[4]) !== file.ino) continue;
    const start = BigInt(`0x${m[1]}`);
    if (BigInt(`0x${m[2]}`) - start === BigInt(bytes)) return start;
  }
  throw new VmError('hypervisor', `no ${bytes}-byte mapping of ${path} in process ${pid}`);
}

/** The runs [first, count) of consecutive indexes in [0, count) for which `pick` holds. */
function runsWhere(count: number, pick: (i: number) => boolean): Array<[number, number]> {
  const runs: Array<[number, number]> = [];
  let runStart = -1;
  for (let i = 0; i < count; i++) {
    const picked = pick(i);
    if (picked && runStart < 0) runStart = i;
    if (!picked && runStart >= 0) {
      runs.push([runStart, i - runStart]);
      runStart = -1;
    }
  }
  if (runStart >= 0) runs.push([runStart, count - runStart]);
  return runs;
}

/** Runs of page indexes [first, count) that are anonymous (written) in the mapping. */
export function writtenRuns(pagemap: Buffer): Array<[number, number]> {
  return runsWhere(pagemap.length / 8, (i) => {
    const high = pagemap.readUInt32LE(i * 8 + 4);
    return ((high & PRESENT) !== 0 && (high & FILE_OR_SHARED) === 0) || (high & SWAPPED) !== 0;
  });
}

/**
 * Calls `sink` with every run of pages process `pid` has written in its private mapping of
 * `basePath` (`bytes` long), in order, as (byte offset in the mapping, buffer, length); the
 * buffer is reused between calls. The process must be paused. Returns the bytes seen.
 *
 * Synchronous reads, in slices between which the event loop runs: the guest is paused
 * meanwhile, and a thread-pool round trip per run of pages (hundreds of runs) made a copy many
 * times slower (docs/architecture.md, "Measured choices in the code").
 */
async function forEachWrittenChunk(
  pid: number,
  basePath: string,
  bytes: number,
  sink: (offset: number, data: Buffer, length: number) => void,
): Promise<number> {
  const start = Number(await findMapping(pid, basePath, bytes));
  const table = Buffer.alloc((bytes / PAGE) * 8);
  const pagemap = openSync(`/proc/${pid}/pagemap`, 'r');
  try {
    const got = readSync(pagemap, table, 0, table.length, (start / PAGE) * 8);
    if (got !== table.length)
      throw new VmError('io', `short read of the pagemap of process ${pid}`);
  } finally {
    closeSync(pagemap);
  }
  const runs = writtenRuns(table);
  const mem = openSync(`/proc/${pid}/mem`, 'r');
  try {
    return await forEachRunSlice(runs, (chunk, length, page) => {
      const offset = page * PAGE;
      if (readSync(mem, chunk, 0, length, start + offset) !== length) {
        throw new VmError('io', `short read of guest RAM at page ${page}`);
      }
      sink(offset, chunk, length);
    });
  } finally {
    closeSync(mem);
  }
}

/**
 * Moves the pages `runs` a slice at a time: `move` gets a buffer to read `length` bytes of
 * pages into, from page `page` on, and write them where they go. The event loop runs between
 * slices of SLICE_BYTES. Returns bytes moved.
 */
async function forEachRunSlice(
  runs: ReadonlyArray<[number, number]>,
  move: (chunk: Buffer, length: number, page: number) => void,
): Promise<number> {
  const chunk = Buffer.alloc(CHUNK_BYTES);
  let moved = 0;
  let sinceYield = 0;
  for (const [first, count] of runs) {
    for (let done = 0; done < count;) {
      const n = Math.min(count - done, chunk.length / PAGE);
      move(chunk, n * PAGE, first + done);
      moved += n * PAGE;
      sinceYield += n * PAGE;
      done += n;
      if (sinceYield >= SLICE_BYTES) {
        sinceYield = 0;
        await yieldToEventLoop();
      }
    }
  }
  return moved;
}

/** One all-zero page, to compare pages against. */
const ZERO_PAGE = Buffer.alloc(PAGE);

function isZeroPage(buf: Buffer, at: number): boolean {
  return buf.compare(ZERO_PAGE, 0, PAGE, at, at + PAGE) === 0;
}

/**
 * The runs [first page, count) of a chunk of written pages (`length` bytes of `data`) that a
 * copy must keep: a page that is zero now and zero in the base comes back identical from the
 * base and is left out. Whether the base's page is zero: `baseIsZero(page in the chunk)` when it
 * knows (the base's holes, zero-pages.ts), else `readBase()`'s bytes (the base's at the chunk's
 * offset, read at most once, and only when a zero page needs it). The guest kernel zeroes every
 * page it frees (`init_on_free`, see guest/image/build-boot.sh), so this leaves out most of what
 * a guest allocated and freed since its restore (a dropped page cache, a freed buffer), which it
 * did write.
 */
export function keptPages(
  data: Buffer,
  length: number,
  readBase: () => Buffer,
  baseIsZero: (page: number) => boolean = () => false,
): Array<[number, number]> {
  let base: Buffer | null = null;
  return runsWhere(length / PAGE, (p) => {
    if (!isZeroPage(data, p * PAGE)) return true;
    if (baseIsZero(p)) return false;
    base ??= readBase();
    return !isZeroPage(base, p * PAGE);
  });
}

/**
 * Calls `sink` with every run of written pages (as forEachWrittenChunk) that differs from the
 * base `basePath` (see keptPages), as (byte offset in the mapping, buffer, offset in the
 * buffer, length). `baseZero`: the base's pages known to be zero, used only if it was made from
 * the file open now (else every zero page's base page is read, as without it). Returns the
 * bytes passed on.
 */
async function forEachKeptRun(
  pid: number,
  basePath: string,
  bytes: number,
  baseZero: ZeroPages | null,
  sink: (offset: number, data: Buffer, from: number, length: number) => void,
): Promise<number> {
  const base = openSync(basePath, 'r');
  const baseChunk = Buffer.alloc(CHUNK_BYTES);
  let kept = 0;
  try {
    const zero = baseZero?.matches(fstatSync(base, { bigint: true })) ? baseZero : null;
    await forEachWrittenChunk(pid, basePath, bytes, (offset, data, length) => {
      const readBase = (): Buffer => {
        readExactly(base, baseChunk, length, offset, `${basePath} is shorter than guest RAM`);
        return baseChunk;
      };
      const firstPage = offset / PAGE;
      const baseIsZero = zero ? (p: number) => zero.has(firstPage + p) : undefined;
      for (const [first, count] of keptPages(data, length, readBase, baseIsZero)) {
        sink(offset + first * PAGE, data, first * PAGE, count * PAGE);
        kept += count * PAGE;
      }
    });
  } finally {
    closeSync(base);
  }
  return kept;
}

/**
 * Copies every page process `pid` has written in its private mapping of `basePath` into the
 * same offsets of `target` (a copy of the base): the image of a fork point. The process must be
 * paused. Written pages that are zero, as the base is there, are left as they are in the
 * copy; `baseZero` as in forEachKeptRun. Returns bytes copied. `runs`, if given, receives the
 * runs [first page, count) copied, in order: what `target` holds that the base does not, from
 * which `writeDeltaFrom` can later write a page delta without the process.
 */
export async function copyWrittenPages(
  pid: number,
  basePath: string,
  bytes: number,
  target: string,
  baseZero: ZeroPages | null = null,
  runs?: Array<[number, number]>,
): Promise<number> {
  const out = openSync(target, 'r+');
  try {
    return await forEachKeptRun(pid, basePath, bytes, baseZero, (offset, data, from, length) => {
      writeSync(out, data, from, length, offset);
      if (runs) addRun(runs, offset, length);
    });
  } finally {
    closeSync(out);
  }
}

/** Appends the pages at byte `offset`, `length` long, to `runs`, joining the last run. */
function addRun(runs: Array<[number, number]>, offset: number, length: number): void {
  const first = offset / PAGE;
  const last = runs[runs.length - 1];
  if (last && last[0] + last[1] === first) last[1] += length / PAGE;
  else runs.push([first, length / PAGE]);
}

/**
 * A page delta file: only the pages a VM wrote, so that a paused sandbox costs on disk about
 * what it changed rather than its RAM size. Layout of format 2: "HDPD", format (u32), page size
 * (u32), run count (u32), the pages of every run in order, then the runs (first page u32, page
 * count u32, little-endian): the table comes last because which pages are kept is known only
 * once they are read. Format 1, written by earlier versions and still read, has the runs right
 * after the header and the pages after them.
 */
const DELTA_MAGIC = 'HDPD';
const DELTA_FORMAT = 2;
const HEADER_BYTES = 16;

/**
 * Writes the pages process `pid` has written in its mapping of `basePath` to `deltaPath` as a
 * page delta file; pages zero here and in the base are left out (keptPages; `baseZero` as in
 * forEachKeptRun). The process must be paused. Returns bytes of pages written. Not synced: the
 * caller syncs it off the event loop with the pause's other files (vm/storage/durable.ts).
 */
export async function saveWrittenPages(
  pid: number,
  basePath: string,
  bytes: number,
  deltaPath: string,
  baseZero: ZeroPages | null = null,
): Promise<number> {
  const out = openSync(deltaPath, 'wx', 0o640);
  const runs: Array<[number, number]> = [];
  let at = HEADER_BYTES;
  try {
    const saved = await forEachKeptRun(
      pid,
      basePath,
      bytes,
      baseZero,
      (offset, data, from, length) => {
        writeSync(out, data, from, length, at);
        at += length;
        addRun(runs, offset, length);
      },
    );
    finishDelta(out, runs, at);
    return saved;
  } finally {
    closeSync(out);
  }
}

/** Writes a delta's run table at `at` (after its pages) and its header. */
function finishDelta(out: number, runs: ReadonlyArray<[number, number]>, at: number): void {
  const table = Buffer.alloc(runs.length * 8);
  runs.forEach(([first, count], i) => {
    table.writeUInt32LE(first, i * 8);
    table.writeUInt32LE(count, i * 8 + 4);
  });
  writeSync(out, table, 0, table.length, at);
  const header = Buffer.alloc(HEADER_BYTES);
  header.write(DELTA_MAGIC, 0, 'latin1');
  header.writeUInt32LE(DELTA_FORMAT, 4);
  header.writeUInt32LE(PAGE, 8);
  header.writeUInt32LE(runs.length, 12);
  writeSync(out, header, 0, header.length, 0);
}

/**
 * Writes the pages `runs` of the image file `imagePath` to `deltaPath` as a page delta file:
 * the delta of a fork point against the base it was copied from, when `runs` are the pages its
 * capture wrote into the copy (copyWrittenPages). Reads in slices between which the event loop
 * runs. Returns bytes of pages written. Not synced (vm/storage/durable.ts syncs it).
 */
export async function writeDeltaFrom(
  imagePath: string,
  runs: ReadonlyArray<[number, number]>,
  deltaPath: string,
): Promise<number> {
  const input = openSync(imagePath, 'r');
  let out: number | null = null;
  try {
    const fd = (out = openSync(deltaPath, 'wx', 0o640));
    let at = HEADER_BYTES;
    await forEachRunSlice(runs, (chunk, length, page) => {
      readExactly(input, chunk, length, page * PAGE, `${imagePath} is too short`);
      writeSync(fd, chunk, 0, length, at);
      at += length;
    });
    finishDelta(fd, runs, at);
    return at - HEADER_BYTES;
  } finally {
    if (out !== null) closeSync(out);
    closeSync(input);
  }
}

/**
 * Writes the pages of the delta file `deltaPath` into the file `target` (a copy of the base the
 * delta was made against, `bytes` of guest RAM) at their offsets: the image the delta was made
 * from, again. Returns bytes written.
 */
export async function applyDeltaTo(
  deltaPath: string,
  target: string,
  bytes: number,
): Promise<number> {
  const input = openSync(deltaPath, 'r');
  let out: number | null = null;
  try {
    const fd = (out = openSync(target, 'r+'));
    const { runs, pagesAt } = readDeltaLayout(input, deltaPath, bytes);
    let at = pagesAt;
    return await forEachRunSlice(runs, (chunk, length, page) => {
      readExactly(input, chunk, length, at, `${deltaPath} is truncated`);
      at += length;
      writeSync(fd, chunk, 0, length, page * PAGE);
    });
  } finally {
    if (out !== null) closeSync(out);
    closeSync(input);
  }
}

/**
 * Writes the pages of the delta file `deltaPath` into process `pid`'s private mapping of
 * `basePath`, before the guest runs: the kernel copies each page on write, so the process ends
 * up with exactly the RAM that was saved, its own pages private as they were. Returns bytes.
 */
export async function loadWrittenPages(
  pid: number,
  basePath: string,
  bytes: number,
  deltaPath: string,
): Promise<number> {
  const start = Number(await findMapping(pid, basePath, bytes));
  const input = openSync(deltaPath, 'r');
  const mem = openSync(`/proc/${pid}/mem`, 'r+');
  try {
    const { runs, pagesAt } = readDeltaLayout(input, deltaPath, bytes);
    let at = pagesAt;
    return await forEachRunSlice(runs, (chunk, length, page) => {
      readExactly(input, chunk, length, at, `${deltaPath} is truncated`);
      at += length;
      if (writeSync(mem, chunk, 0, length, start + page * PAGE) !== length) {
        throw new VmError('io', `short write of guest RAM at ${page}`);
      }
    });
  } finally {
    closeSync(mem);
    closeSync(input);
  }
}

/** The runs of a delta file and where its pages start, checked against its size and the RAM's. */
function readDeltaLayout(
  fd: number,
  path: string,
  bytes: number,
): { runs: Array<[number, number]>; pagesAt: number } {
  const head = Buffer.alloc(HEADER_BYTES);
  readExactly(fd, head, HEADER_BYTES, 0, `${path} is truncated`);
  const format = head.readUInt32LE(4);
  if (head.toString('latin1', 0, 4) !== DELTA_MAGIC || (format !== 1 && format !== 2)) {
    throw new VmError('state_corrupt', `${path} is not a page delta of format 1 or 2`);
  }
  if (head.readUInt32LE(8) !== PAGE)
    throw new VmError('state_corrupt', `${path} has another page size`);
  const runCount = head.readUInt32LE(12);
  const size = fstatSync(fd).size;
  const tableAt = format === 1 ? HEADER_BYTES : size - runCount * 8;
  if (tableAt < HEADER_BYTES) throw new VmError('state_corrupt', `${path} is truncated`);
  const table = Buffer.alloc(runCount * 8);
  readExactly(fd, table, table.length, tableAt, `${path} is truncated`);
  const runs: Array<[number, number]> = [];
  let pages = 0;
  for (let r = 0; r < runCount; r++) {
    const first = table.readUInt32LE(r * 8);
    const count = table.readUInt32LE(r * 8 + 4);
    if ((first + count) * PAGE > bytes)
      throw new VmError('state_corrupt', `${path} runs past guest RAM`);
    runs.push([first, count]);
    pages += count;
  }
  const pagesAt = format === 1 ? HEADER_BYTES + table.length : HEADER_BYTES;
  if (pagesAt + pages * PAGE + (format === 2 ? table.length : 0) !== size) {
    throw new VmError('state_corrupt', `${path} is truncated`);
  }
  return { runs, pagesAt };
}

function readExactly(fd: number, buf: Buffer, length: number, position: number, why: string): void {
  if (readSync(fd, buf, 0, length, position) !== length) throw new VmError('state_corrupt', why);
}
