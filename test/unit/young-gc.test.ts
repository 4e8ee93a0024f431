import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { YoungGcPacer, youngGcAvailable } from '../../src/vm/channels/young-gc.js';

describe('a transfer asks for a minor collection every few MiB it moves', () => {
  test('one collection each time the bytes moved reach the interval, none before', () => {
    let collections = 0;
    const pacer = new YoungGcPacer(100, () => collections++);
    pacer.add(60);
    assert.equal(collections, 0);
    pacer.add(40);
    assert.equal(collections, 1);
    for (let i = 0; i < 10; i++) pacer.add(50);
    assert.equal(collections, 6);
  });

  test("V8's own collector runs when nothing is injected, and the heap stays usable", () => {
    assert.equal(youngGcAvailable(), true);
    const pacer = new YoungGcPacer(1);
    pacer.add(1);
    assert.equal(Buffer.from('still here').toString(), 'still here');
    assert.equal((globalThis as { gc?: unknown }).gc, undefined, 'gc is not exposed globally');
  });
});
