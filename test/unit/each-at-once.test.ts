/**
 * The "each item, N at once" helper (core/each-at-once.ts) that the drain's hand-overs and the
 * shutdown's pauses share: never more than N at once, every item once, in order, and an item
 * that fails neither stops the others nor goes unreported.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { eventually } from '../../testkit/eventually.js';
import { eachAtOnce, turns } from '../../src/core/each-at-once.js';

/** Items whose work ends when the test says so, recording what runs. */
function gated(): {
  each: (item: number) => Promise<void>;
  running: Set<number>;
  started: number[];
  /** The most items that ever ran at once, measured as each starts, not when the test looks. */
  peak: () => number;
  finish: (item: number, err?: Error) => void;
  untilRunning: (n: number) => Promise<void>;
} {
  const running = new Set<number>();
  const started: number[] = [];
  const ends = new Map<number, (err?: Error) => void>();
  const waiters: (() => void)[] = [];
  let peak = 0;
  const each = (item: number): Promise<void> =>
    new Promise<void>((resolve, reject) => {
      running.add(item);
      started.push(item);
      peak = Math.max(peak, running.size);
      ends.set(item, (err) => {
        running.delete(item);
        if (err) reject(err);
        else resolve();
      });
      for (const w of waiters.splice(0)) w();
    });
  const finish = (item: number, err?: Error): void => {
    const end = ends.get(item);
    assert.ok(end, `item ${item} has not started`);
    end(err);
  };
  const untilRunning = async (n: number): Promise<void> => {
    while (started.length < n) await new Promise<void>((r) => waiters.push(r));
    // Let the workers that just finished one take their next before the test looks.
    await new Promise((r) => setImmediate(r));
  };
  return { each, running, started, peak: () => peak, finish, untilRunning };
}

test('at most N run at once; the next starts as one ends, in the order given', async () => {
  const g = gated();
  const done = eachAtOnce([1, 2, 3, 4, 5], 2, g.each);
  await g.untilRunning(2);
  assert.deepEqual([...g.running], [1, 2]);
  g.finish(2);
  await g.untilRunning(3);
  assert.deepEqual([...g.running].sort(), [1, 3]);
  g.finish(1);
  g.finish(3);
  await g.untilRunning(5);
  assert.deepEqual([...g.running].sort(), [4, 5]);
  g.finish(4);
  g.finish(5);
  await done;
  assert.deepEqual(g.started, [1, 2, 3, 4, 5], 'each item once, in order');
  assert.equal(g.peak(), 2, 'never more than 2 at once');
});

test('a failing item does not stop the others; the first failure is thrown at the end', async () => {
  const g = gated();
  let settled = false;
  const done = eachAtOnce([1, 2, 3], 2, g.each).finally(() => {
    settled = true;
  });
  await g.untilRunning(2);
  const first = new Error('first');
  g.finish(1, first);
  await g.untilRunning(3);
  g.finish(2, new Error('second'));
  await new Promise((r) => setImmediate(r));
  assert.equal(settled, false, 'item 3 is still running');
  g.finish(3);
  await assert.rejects(done, (err) => err === first);
  assert.deepEqual(g.started, [1, 2, 3]);
});

test('no items: done at once; fewer items than N: all at once', async () => {
  await eachAtOnce([], 4, () => Promise.reject(new Error('never called')));
  const g = gated();
  const done = eachAtOnce([1, 2], 4, g.each);
  await g.untilRunning(2);
  assert.deepEqual([...g.running], [1, 2]);
  g.finish(1);
  g.finish(2);
  await done;
});

test('turns: at most N held at once, given in the order asked; an end twice ends once', async () => {
  const take = turns(2);
  const got: number[] = [];
  const ends: (() => void)[] = [];
  const ask = (i: number): void => {
    void take().then((end) => {
      got.push(i);
      ends[i] = end;
    });
  };
  [0, 1, 2, 3].forEach(ask);
  await eventually('two turns given', () => got.length === 2);
  assert.deepEqual(got, [0, 1]);
  ends[1]!();
  ends[1]!(); // a second end frees nothing more
  await eventually('the third turn given', () => got.length === 3);
  assert.deepEqual(got, [0, 1, 2]);
  await new Promise(setImmediate); // every promise settled: the double end gave no fourth turn
  assert.equal(got.length, 3);
  ends[0]!();
  await eventually('the fourth turn given', () => got.length === 4);
  assert.deepEqual(got, [0, 1, 2, 3]);
});

test('turns: no limit when N is not a finite number of at least 1', async () => {
  for (const n of [Infinity, 0, Number.NaN]) {
    const take = turns(n);
    const ends = await Promise.all(Array.from({ length: 40 }, () => take()));
    assert.equal(ends.length, 40);
  }
});
