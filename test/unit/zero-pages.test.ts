/**
 * Which pages of a RAM image are known zero from its holes (vm/storage/zero-pages.ts): only
 * pages wholly inside a hole, and only from a complete, well-formed listing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { mkdtemp, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MemImage } from '../../src/vm/storage/mem-image.js';
import {
  fileVersion,
  parseHoles,
  readZeroPages,
  ZeroPages,
} from '../../src/vm/storage/zero-pages.js';

const version = { dev: 1n, ino: 2n, size: 8n * 4096n, mtimeNs: 3n };

test('only pages wholly inside a hole are known zero', () => {
  // A hole from the middle of page 1 to the end of page 3, and one over page 6 to the end
  const zero = ZeroPages.fromHoles(
    [
      [4096 + 512, 4 * 4096],
      [6 * 4096, 8 * 4096],
    ],
    version,
  );
  assert.deepEqual(
    Array.from({ length: 9 }, (_, p) => zero.has(p)),
    [false, false, true, true, false, false, true, true, false],
  );
  assert.equal(zero.count(), 4);
  assert.equal(zero.has(-1), false);
});

test('a listing out of order, past the end, or cut short is refused', () => {
  const size = 8 * 4096;
  assert.deepEqual(parseHoles(`0 4096\n8192 16384\nend ${size}\n`, size), [
    [0, 4096],
    [8192, 16384],
  ]);
  assert.deepEqual(parseHoles(`end ${size}\n`, size), []);
  assert.equal(parseHoles('0 4096\n', size), null, 'no end line: perl stopped midway');
  assert.equal(parseHoles(`8192 16384\n0 4096\nend ${size}\n`, size), null);
  assert.equal(parseHoles(`0 ${size + 4096}\nend ${size}\n`, size), null);
  assert.equal(parseHoles(`0 4096\nend ${size - 4096}\n`, size), null, 'another size');
  assert.equal(parseHoles(`x y\nend ${size}\n`, size), null);
});

test('a map holds for the file version it was made from only', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'zero-pages-'));
  try {
    const file = join(dir, 'image');
    await writeFile(file, Buffer.alloc(4096, 1));
    await truncate(file, 4 * 4096);
    const zero = await readZeroPages(file);
    assert.ok(zero);
    assert.equal(zero.has(0), false, 'data is never known zero');
    assert.ok(zero.matches(statSync(file, { bigint: true })));
    assert.deepEqual(zero.version, fileVersion(statSync(file, { bigint: true })));
    await truncate(file, 5 * 4096);
    assert.equal(zero.matches(statSync(file, { bigint: true })), false);
    assert.equal(await readZeroPages(file, join(dir, 'no-perl')), null, 'no perl: no map');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('an image learns its holes once complete; one that cannot be read has none', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'zero-pages-'));
  try {
    const file = join(dir, 'image');
    await writeFile(file, Buffer.alloc(4096, 1));
    await truncate(file, 4 * 4096);
    const image = new MemImage(file);
    assert.equal(image.zeroPages, null, 'nothing known before it is learnt');
    image.learnZeroPages();
    const zero = await image.zeroPagesLearnt();
    assert.equal(image.zeroPages, zero);
    const gone = new MemImage(join(dir, 'gone'));
    gone.learnZeroPages();
    assert.equal(await gone.zeroPagesLearnt(), null, 'a missing file: no map, no failure');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
