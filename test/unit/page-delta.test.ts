/**
 * Which guest pages a fork copies: those a clone has written (anonymous, or swapped out), read
 * from its /proc/PID/pagemap. Pages still backed by the base file are shared, never copied.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writtenRuns } from '../../src/vm/page-delta.js';

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
