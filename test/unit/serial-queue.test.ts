import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SerialQueue } from '../../src/core/serial-queue.js';
import { fail, HostdError } from '../../src/errors.js';

test('turns are granted in arrival order, one at a time', async () => {
  const q = new SerialQueue(10);
  const order: number[] = [];
  const r1 = await q.acquire();
  const p2 = q.acquire().then((r) => (order.push(2), r));
  const p3 = q.acquire().then((r) => (order.push(3), r));
  assert.equal(q.waiting, 2);
  r1();
  (await p2)();
  (await p3)();
  assert.deepEqual(order, [2, 3]);
  assert.equal(q.running, false);
});

test('a waiter whose client left is removed from the line', async () => {
  const q = new SerialQueue(10);
  const r1 = await q.acquire();
  const ac = new AbortController();
  const p = q.acquire(ac.signal);
  ac.abort();
  await assert.rejects(p, HostdError);
  assert.equal(q.waiting, 0);
  r1();
  assert.equal(q.running, false);
});

test('closing rejects every waiter with the given error; the holder is not interrupted', async () => {
  const q = new SerialQueue(10);
  const r1 = await q.acquire();
  const p = q.acquire();
  q.close(fail('sandboxNotFound', 'gone'));
  await assert.rejects(p, (e: unknown) => e instanceof HostdError && e.status === 404);
  await assert.rejects(q.acquire(), (e: unknown) => e instanceof HostdError && e.status === 404);
  r1();
});

test('too many waiters is a 429', async () => {
  const q = new SerialQueue(1);
  await q.acquire();
  void q.acquire();
  await assert.rejects(q.acquire(), (e: unknown) => e instanceof HostdError && e.status === 429);
});
