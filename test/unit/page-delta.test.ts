/**
 * Which guest pages a fork copies: those a clone has written (anonymous, or swapped out), read
 * from its /proc/PID/pagemap. Pages still backed by the base file are shared, never copied.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, writeSync } from 'node:fs';
import { mkdtemp, readFile, rm, stat, truncate, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import {
  keptPages,
  loadWrittenPages,
  saveWrittenPages,
  writtenRuns,
} from '../../src/vm/storage/page-delta.js';
import { readZeroPages } from '../../src/vm/storage/zero-pages.js';

const PRESENT = 1n << 63n;
const SWAPPED = 1n << 62n;
const FILE = 1n << 61n;

function pagemap(entries: bigint[]): Buffer {
  const buf = Buffer.alloc(entries.length * 8);
  entries.forEach((e, i) => buf.writeBigUInt64LE(e, i * 8));
  return buf;
}

test('written pages are present and anonymous, or swapped; file-backed and absent are not', () => {
  const anon = PRESENT | 0x1234n; // a page frame number in the low bits does not matter
  const map = pagemap([0n, anon, anon, PRESENT | FILE, SWAPPED, 0n, FILE, anon]);
  assert.deepEqual(writtenRuns(map), [
    [1, 2],
    [4, 1],
    [7, 1],
  ]);
});

test('no written page gives no run; all written gives one run', () => {
  assert.deepEqual(writtenRuns(pagemap([0n, PRESENT | FILE, 0n])), []);
  assert.deepEqual(writtenRuns(pagemap([PRESENT, PRESENT, SWAPPED])), [[0, 3]]);
});

/** `pages` pages, page i filled with byte fills[i]. */
function pagesOf(fills: number[]): Buffer {
  return Buffer.concat(fills.map((b) => Buffer.alloc(4096, b)));
}

test('a written page that is zero, as its base is, is left out; any other is kept', () => {
  const data = pagesOf([1, 0, 0, 2, 0]);
  const base = pagesOf([0, 0, 5, 0, 0]);
  let reads = 0;
  const read = (): Buffer => {
    reads++;
    return base;
  };
  assert.deepEqual(keptPages(data, data.length, read), [
    [0, 1],
    [2, 2],
  ]);
  assert.equal(reads, 1, 'the base is read once per chunk');
  const noZero = pagesOf([1, 2]);
  assert.deepEqual(keptPages(noZero, noZero.length, read), [[0, 2]]);
  assert.equal(reads, 1, 'and not at all when no page is zero');
});

test('a zero page whose base page is known zero needs no base read', () => {
  const data = pagesOf([1, 0, 0, 2, 0]);
  const base = pagesOf([0, 0, 5, 0, 0]);
  let reads = 0;
  const read = (): Buffer => {
    reads++;
    return base;
  };
  // Pages 1 and 4 are holes of the base: no read at all, and they are still left out
  assert.deepEqual(
    keptPages(data, data.length, read, (p) => p === 1 || p === 4),
    [
      [0, 1],
      [2, 2],
    ],
  );
  assert.equal(reads, 1, 'page 2, not known zero, is read from the base');
  assert.deepEqual(
    keptPages(pagesOf([0, 3, 0]), 3 * 4096, read, () => true),
    [[1, 1]],
  );
  assert.equal(reads, 1, 'nothing read when the base is known zero wherever the page is');
});

/**
 * A process with a private mapping of `file` (as QEMU maps guest RAM) that writes `writes`
 * (page index -> byte) into it, says "ready", then prints its mapping's hash for each stdin line.
 */
function mapper(file: string, bytes: number, writes: Record<number, number>): ChildProcess {
  const code = `
import mmap, sys, hashlib, json
f = open(${JSON.stringify(file)}, "r+b")
m = mmap.mmap(f.fileno(), ${bytes}, flags=mmap.MAP_PRIVATE)
for page, byte in json.loads(sys.argv[1]).items():
    m[int(page) * 4096:(int(page) + 1) * 4096] = bytes([byte]) * 4096
print("ready", flush=True)
for line in sys.stdin:
    print(hashlib.sha256(m[:]).hexdigest(), flush=True)
`;
  return spawn('python3', ['-c', code, JSON.stringify(writes)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
}

/** The next line of `p`'s stdout, reading line by line (nothing is lost between calls). */
function lines(p: ChildProcess): () => Promise<string> {
  const it = createInterface({ input: p.stdout! })[Symbol.asyncIterator]();
  return async () => (await it.next()).value as string;
}

/** A running mapper: its pid, and the hash of its whole mapping now. */
interface Mapped {
  pid: number;
  hash(): Promise<string>;
}

/**
 * Runs `body` with a temporary directory holding `base.img` (`base`'s bytes, as `write` writes
 * them) and one mapper of
 * it per entry of `writes`, ready; removes them all after, whatever happens.
 */
async function withMappers(
  base: Buffer,
  writes: Array<Record<number, number>>,
  body: (dir: string, baseFile: string, mapped: Mapped[]) => Promise<void>,
  write: (file: string, content: Buffer) => Promise<void> = writeFile,
): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'page-delta-'));
  const baseFile = join(dir, 'base.img');
  await write(baseFile, base);
  const procs = writes.map((w) => mapper(baseFile, base.length, w));
  try {
    const mapped = await Promise.all(
      procs.map(async (p) => {
        const next = lines(p);
        assert.equal(await next(), 'ready');
        return {
          pid: p.pid!,
          hash: async () => {
            p.stdin!.write('\n');
            return next();
          },
        };
      }),
    );
    await body(dir, baseFile, mapped);
  } finally {
    for (const p of procs) p.kill();
    await rm(dir, { recursive: true, force: true });
  }
}

test('a page delta saved from one process and loaded into another reproduces its RAM', async () => {
  const bytes = 64 * 4096;
  const writes: Array<Record<number, number>> = [{ 3: 1, 4: 2, 40: 3 }, {}];
  await withMappers(Buffer.alloc(bytes, 7), writes, async (dir, base, [source, target]) => {
    const delta = join(dir, 'delta');
    assert.equal(await saveWrittenPages(source!.pid, base, bytes, delta), 3 * 4096);
    assert.ok((await stat(delta)).size < 4 * 4096, 'the delta holds the written pages only');
    assert.equal(await loadWrittenPages(target!.pid, base, bytes, delta), 3 * 4096);
    assert.equal(await target!.hash(), await source!.hash());
    assert.deepEqual(await readFile(base), Buffer.alloc(bytes, 7), 'the base file is untouched');
  });
});

test('a delta leaves out pages zero here and in the base, and still reproduces the RAM', async () => {
  const bytes = 16 * 4096;
  // Pages 0-7 zero in the base (free memory of a frozen template), 8-15 not
  const content = Buffer.concat([Buffer.alloc(bytes / 2), Buffer.alloc(bytes / 2, 7)]);
  // Zero over zero (2, 3: memory freed since the restore), zero over data (9), data (4, 10)
  const writes: Array<Record<number, number>> = [{ 2: 0, 3: 0, 4: 1, 9: 0, 10: 2 }, {}];
  await withMappers(content, writes, async (dir, base, [source, target]) => {
    const delta = join(dir, 'delta');
    assert.equal(await saveWrittenPages(source!.pid, base, bytes, delta), 3 * 4096);
    assert.equal(await loadWrittenPages(target!.pid, base, bytes, delta), 3 * 4096);
    assert.equal(await target!.hash(), await source!.hash());
  });
});

test('a delta of format 1 (earlier versions: runs before the pages) still loads', async () => {
  const bytes = 8 * 4096;
  const header = Buffer.alloc(16 + 2 * 8);
  header.write('HDPD', 0, 'latin1');
  header.writeUInt32LE(1, 4);
  header.writeUInt32LE(4096, 8);
  header.writeUInt32LE(2, 12);
  header.writeUInt32LE(1, 16); // run 1: page 1, one page
  header.writeUInt32LE(1, 20);
  header.writeUInt32LE(5, 24); // run 2: pages 5-6
  header.writeUInt32LE(2, 28);
  const writes: Array<Record<number, number>> = [{ 1: 1, 5: 2, 6: 3 }, {}];
  await withMappers(Buffer.alloc(bytes, 7), writes, async (dir, base, [expected, target]) => {
    const delta = join(dir, 'delta');
    await writeFile(delta, Buffer.concat([header, pagesOf([1, 2, 3])]));
    assert.equal(await loadWrittenPages(target!.pid, base, bytes, delta), 3 * 4096);
    assert.equal(await target!.hash(), await expected!.hash());
    await writeFile(delta, Buffer.concat([header, pagesOf([1, 2])]));
    await assert.rejects(loadWrittenPages(target!.pid, base, bytes, delta), 'a short file fails');
  });
});

/** `file` rewritten sparse: every all-zero page of `content` a hole (as `fallocate --dig-holes`). */
async function writeSparse(file: string, content: Buffer): Promise<void> {
  await writeFile(file, Buffer.alloc(0));
  await truncate(file, content.length);
  const fd = openSync(file, 'r+');
  try {
    for (let p = 0; p < content.length / 4096; p++) {
      const page = content.subarray(p * 4096, (p + 1) * 4096);
      if (page.some((b) => b !== 0)) writeSync(fd, page, 0, 4096, p * 4096);
    }
  } finally {
    closeSync(fd);
  }
}

test("the base holes spare the zero pages' reads, and the delta still reproduces the RAM", async () => {
  const bytes = 16 * 4096;
  // Pages 0-7 zero in the base (holes, as a template's free memory), 8-15 not
  const content = Buffer.concat([Buffer.alloc(bytes / 2), Buffer.alloc(bytes / 2, 7)]);
  const writes: Array<Record<number, number>> = [{ 2: 0, 3: 0, 4: 1, 9: 0, 10: 2 }, {}];
  await withMappers(
    content,
    writes,
    async (dir, base, [source, target]) => {
      const zero = await readZeroPages(base);
      assert.ok(zero, 'the holes are learnt');
      if (zero.count() === 0) return; // a filesystem without holes: nothing to check here
      assert.deepEqual(
        Array.from({ length: 16 }, (_, p) => zero.has(p)),
        Array.from({ length: 16 }, (_, p) => p < 8),
      );
      const delta = join(dir, 'delta');
      assert.equal(await saveWrittenPages(source!.pid, base, bytes, delta, zero), 3 * 4096);
      assert.equal(await loadWrittenPages(target!.pid, base, bytes, delta), 3 * 4096);
      assert.equal(await target!.hash(), await source!.hash());
    },
    writeSparse,
  );
});

test('a map of holes made before the base changed is not used', async () => {
  const bytes = 8 * 4096;
  const writes: Array<Record<number, number>> = [{ 1: 0, 2: 0 }, {}];
  await withMappers(
    Buffer.alloc(bytes),
    writes,
    async (dir, base, [source, target]) => {
      const stale = await readZeroPages(base);
      assert.ok(stale);
      // Page 2 of the base becomes data after the map was made: the map says zero, it is not
      const fd = openSync(base, 'r+');
      writeSync(fd, Buffer.alloc(4096, 9), 0, 4096, 2 * 4096);
      closeSync(fd);
      await utimes(base, new Date(), new Date(Date.now() + 5000));
      const delta = join(dir, 'delta');
      // Page 2 is zero in the source but not in the base: it must be kept
      assert.equal(await saveWrittenPages(source!.pid, base, bytes, delta, stale), 4096);
      assert.equal(await loadWrittenPages(target!.pid, base, bytes, delta), 4096);
      assert.equal(await target!.hash(), await source!.hash());
    },
    writeSparse,
  );
});
