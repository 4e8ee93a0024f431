/**
 * Finds and copies the guest RAM pages a clone has written since it was restored.
 *
 * A clone maps its base image privately, so the kernel gives it an anonymous copy of every page
 * it writes and leaves every other page a page of the base file. `/proc/PID/pagemap` tells the
 * two apart (bit 61: file page); `/proc/PID/mem` reads the anonymous ones. Copying the base file
 * plus these pages reproduces the clone's RAM exactly, at the cost of the pages written rather
 * than of the whole RAM (QEMU's own migration copies all of it, at about 100 MB/s under TCG).
 */
import { closeSync, openSync, readSync, writeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';

const PAGE = 4096;
// Flags in the high 32-bit half of a pagemap entry (bits 63, 62, 61 of the 64-bit entry).
const PRESENT = 1 << 31;
const SWAPPED = 1 << 30;
const FILE_OR_SHARED = 1 << 29;
/** Bytes copied between two yields to the event loop. */
const SLICE_BYTES = 8 * 1024 * 1024;

/** Start address of the mapping of `path` of exactly `bytes` in process `pid`. */
export async function findMapping(pid: number, path: string, bytes: number): Promise<bigint> {
  const maps = await readFile(`/proc/${pid}/maps`, 'utf8');
  for (const line of maps.split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s+(.*)$/.exec(line);
    if (!m) continue;
    const name = m[3]!.replace(/ \(deleted\)$/, '');
    const start = BigInt(`0x${m[1]}`);
    if (name === path && BigInt(`0x${m[2]}`) - start === BigInt(bytes)) return start;
  }
  throw new Error(`no ${bytes}-byte mapping of ${path} in process ${pid}`);
}

/** Runs of page indexes [first, count) that are anonymous (written) in the mapping. */
export function writtenRuns(pagemap: Buffer): Array<[number, number]> {
  const runs: Array<[number, number]> = [];
  const pages = pagemap.length / 8;
  let runStart = -1;
  for (let i = 0; i < pages; i++) {
    const high = pagemap.readUInt32LE(i * 8 + 4);
    const written =
      ((high & PRESENT) !== 0 && (high & FILE_OR_SHARED) === 0) || (high & SWAPPED) !== 0;
    if (written && runStart < 0) runStart = i;
    if (!written && runStart >= 0) {
      runs.push([runStart, i - runStart]);
      runStart = -1;
    }
  }
  if (runStart >= 0) runs.push([runStart, pages - runStart]);
  return runs;
}

/**
 * Copies every page process `pid` has written in its private mapping of `basePath` into the
 * same offsets of `target` (a copy of the base). The process must be paused. Returns bytes copied.
 *
 * Synchronous reads and writes, in slices between which the event loop runs: the guest is
 * paused meanwhile, and a thread-pool round trip per run of pages (hundreds of runs) made a
 * 9 MiB copy take 120 ms instead of ~10.
 */
export async function copyWrittenPages(
  pid: number,
  basePath: string,
  bytes: number,
  target: string,
): Promise<number> {
  const start = Number(await findMapping(pid, basePath, bytes));
  const table = Buffer.alloc((bytes / PAGE) * 8);
  const pagemap = openSync(`/proc/${pid}/pagemap`, 'r');
  try {
    const got = readSync(pagemap, table, 0, table.length, (start / PAGE) * 8);
    if (got !== table.length) throw new Error(`short read of the pagemap of process ${pid}`);
  } finally {
    closeSync(pagemap);
  }
  const mem = openSync(`/proc/${pid}/mem`, 'r');
  const out = openSync(target, 'r+');
  const chunk = Buffer.alloc(4 * 1024 * 1024);
  let copied = 0;
  let sinceYield = 0;
  try {
    for (const [first, count] of writtenRuns(table)) {
      for (let done = 0; done < count;) {
        const n = Math.min(count - done, chunk.length / PAGE);
        const offset = (first + done) * PAGE;
        const got = readSync(mem, chunk, 0, n * PAGE, start + offset);
        if (got !== n * PAGE) throw new Error(`short read of guest RAM at page ${first + done}`);
        writeSync(out, chunk, 0, n * PAGE, offset);
        copied += n * PAGE;
        sinceYield += n * PAGE;
        done += n;
        if (sinceYield >= SLICE_BYTES) {
          sinceYield = 0;
          await yieldToEventLoop();
        }
      }
    }
  } finally {
    closeSync(mem);
    closeSync(out);
  }
  return copied;
}
