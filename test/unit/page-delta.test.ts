/**
 * Which guest pages a fork copies: those a clone has written (anonymous, or swapped out), read
 * from its /proc/PID/pagemap. Pages still backed by the base file are shared, never copied.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import {
  keptPages,
  loadWrittenPages,
  saveWrittenPages,
  writtenRuns,
} from '../../src/vm/page-delta.js';

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

test('a page delta saved from one process and loaded into another reproduces its RAM', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'page-delta-'));
  const bytes = 64 * 4096;
  const base = join(dir, 'base.img');
  await writeFile(base, Buffer.alloc(bytes, 7));
  const source = mapper(base, bytes, { 3: 1, 4: 2, 40: 3 });
  const target = mapper(base, bytes, {});
  const fromSource = lines(source);
  const fromTarget = lines(target);
  try {
    assert.equal(await fromSource(), 'ready');
    assert.equal(await fromTarget(), 'ready');
    const delta = join(dir, 'delta');
    assert.equal(await saveWrittenPages(source.pid!, base, bytes, delta), 3 * 4096);
    assert.ok((await stat(delta)).size < 4 * 4096, 'the delta holds the written pages only');
    assert.equal(await loadWrittenPages(target.pid!, base, bytes, delta), 3 * 4096);
    source.stdin!.write('\n');
    target.stdin!.write('\n');
    assert.equal(await fromTarget(), await fromSource());
    assert.deepEqual(await readFile(base), Buffer.alloc(bytes, 7), 'the base file is untouched');
  } finally {
    source.kill();
    target.kill();
    await rm(dir, { recursive: true, force: true });
  }
});

test('a delta leaves out pages zero here and in the base, and still reproduces the RAM', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'page-delta-'));
  const bytes = 16 * 4096;
  const base = join(dir, 'base.img');
  // Pages 0-7 zero in the base (free memory of a frozen template), 8-15 not
  await writeFile(base, Buffer.concat([Buffer.alloc(bytes / 2), Buffer.alloc(bytes / 2, 7)]));
  // Zero over zero (2, 3: memory freed since the restore), zero over data (9), data (4, 10)
  const source = mapper(base, bytes, { 2: 0, 3: 0, 4: 1, 9: 0, 10: 2 });
  const target = mapper(base, bytes, {});
  const fromSource = lines(source);
  const fromTarget = lines(target);
  try {
    assert.equal(await fromSource(), 'ready');
    assert.equal(await fromTarget(), 'ready');
    const delta = join(dir, 'delta');
    assert.equal(await saveWrittenPages(source.pid!, base, bytes, delta), 3 * 4096);
    assert.equal(await loadWrittenPages(target.pid!, base, bytes, delta), 3 * 4096);
    source.stdin!.write('\n');
    target.stdin!.write('\n');
    assert.equal(await fromTarget(), await fromSource());
  } finally {
    source.kill();
    target.kill();
    await rm(dir, { recursive: true, force: true });
  }
});

test('a delta of format 1 (earlier versions: runs before the pages) still loads', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'page-delta-'));
  const bytes = 8 * 4096;
  const base = join(dir, 'base.img');
  await writeFile(base, Buffer.alloc(bytes, 7));
  const header = Buffer.alloc(16 + 2 * 8);
  header.write('HDPD', 0, 'latin1');
  header.writeUInt32LE(1, 4);
  header.writeUInt32LE(4096, 8);
  header.writeUInt32LE(2, 12);
  header.writeUInt32LE(1, 16); // run 1: page 1, one page
  header.writeUInt32LE(1, 20);
  header.writeUInt32LE(5, 24); // run 2: pages 5-6
  header.writeUInt32LE(2, 28);
  const delta = join(dir, 'delta');
  await writeFile(delta, Buffer.concat([header, pagesOf([1, 2, 3])]));
  const expected = mapper(base, bytes, { 1: 1, 5: 2, 6: 3 });
  const target = mapper(base, bytes, {});
  const fromExpected = lines(expected);
  const fromTarget = lines(target);
  try {
    assert.equal(await fromExpected(), 'ready');
    assert.equal(await fromTarget(), 'ready');
    assert.equal(await loadWrittenPages(target.pid!, base, bytes, delta), 3 * 4096);
    expected.stdin!.write('\n');
    target.stdin!.write('\n');
    assert.equal(await fromTarget(), await fromExpected());
    await writeFile(delta, Buffer.concat([header, pagesOf([1, 2])]));
    await assert.rejects(loadWrittenPages(target.pid!, base, bytes, delta), 'a short file fails');
  } finally {
    expected.kill();
    target.kill();
    await rm(dir, { recursive: true, force: true });
  }
});
