/**
 * Making files durable before a record names them (vm/storage/durable.ts): every file and each
 * directory holding one synced, all at once, each directory once; and a state or layer, which
 * never changes once made, synced once however often it is asked for.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DurableOnce, syncAll, type Syncer } from '../../src/vm/storage/durable.js';

/** A syncer whose syncs wait until `finish()`, recording what was asked. */
function heldSyncer(): Syncer & { asked: string[]; finish: (err?: Error) => void } {
  const asked: string[] = [];
  const waiting: { resolve: () => void; reject: (e: Error) => void }[] = [];
  const wait = (what: string): Promise<void> => {
    asked.push(what);
    return new Promise((resolve, reject) => waiting.push({ resolve, reject }));
  };
  return {
    asked,
    file: (p) => wait(`file ${p}`),
    dir: (p) => wait(`dir ${p}`),
    finish: (err) => {
      for (const w of waiting.splice(0)) {
        if (err) w.reject(err);
        else w.resolve();
      }
    },
  };
}

describe('syncAll', () => {
  it('syncs every file and each of their directories once, all before any has finished', async () => {
    const syncer = heldSyncer();
    let done = false;
    const all = syncAll(['/d/a', '/d/b', '/e/c', '/d/a'], ['/', '/d'], syncer).then(() => {
      done = true;
    });
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(syncer.asked.sort(), [
      'dir /',
      'dir /d',
      'dir /e',
      'file /d/a',
      'file /d/b',
      'file /e/c',
    ]);
    assert.equal(done, false);
    syncer.finish();
    await all;
    assert.equal(done, true);
  });
});

describe('DurableOnce', () => {
  it('syncs an item once, joins one being synced, and tries again after a failure', async () => {
    const syncer = heldSyncer();
    const once = new DurableOnce(syncer);
    const a = { key: {}, files: ['/i/a.mem', '/i/a.state'] };
    const b = { key: {}, files: ['/l/b.qcow2'], dirs: ['/'] };
    const first = once.sync([a]);
    const second = once.sync([a, b]); // a is being synced: only b is new
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(syncer.asked.sort(), [
      'dir /',
      'dir /i',
      'dir /l',
      'file /i/a.mem',
      'file /i/a.state',
      'file /l/b.qcow2',
    ]);
    const diskError = Object.assign(new Error('input/output error'), { code: 'EIO' });
    syncer.finish(diskError);
    await assert.rejects(first, (err) => err === diskError);
    await assert.rejects(second, (err) => err === diskError);
    syncer.asked.length = 0;
    const again = once.sync([a]);
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(syncer.asked.sort(), ['dir /i', 'file /i/a.mem', 'file /i/a.state']);
    syncer.finish();
    await again;
    syncer.asked.length = 0;
    await once.sync([a]); // durable: nothing more
    assert.deepEqual(syncer.asked, []);
  });
});
