import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { FileRecords } from '../../src/core/journal.js';
import type { Syncer } from '../../src/vm/storage/durable.js';
import { eventually } from '../../testkit/eventually.js';

interface Rec {
  id: string;
  n: number;
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hostd-journal-'));
  try {
    await fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const files = (dir: string): string[] => readdirSync(dir).sort();

test('a removed record is not read back from the moment remove returns, and its file goes', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, { lastsReboot: () => false });
    records.write({ id: 'a', n: 1 });
    records.write({ id: 'a', n: 2 }); // rewritten: the case whose unlink waited for the disk
    records.write({ id: 'b', n: 1 });
    records.remove('a');
    assert.deepEqual(
      records.readAll().map((r) => r.id),
      ['b'],
    );
    // Whether the file is unlinked yet depends on the thread pool: the rest is a wait.
    await eventually('the removed record file to go', () => files(dir).length === 1);
    assert.deepEqual(files(dir), ['b.json']);
  }));

test('a record written again right after its removal outlives the deferred unlink', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, { lastsReboot: () => false });
    records.write({ id: 'a', n: 1 });
    records.remove('a');
    records.write({ id: 'a', n: 2 }); // a sandbox handed away and back
    await eventually('the removed file to go', () => files(dir).length === 1);
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 2 }]);
  }));

test('removing a record that is not there does nothing', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir);
    records.remove('nope');
    records.remove('nope');
    assert.deepEqual(files(dir), []);
  }));

test('what a crash left mid-write or mid-removal is dropped by the next read, not read', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir);
    records.write({ id: 'kept', n: 1 });
    await records.flush();
    writeFileSync(join(dir, 'gone.json.123-1.gone'), JSON.stringify({ id: 'gone', n: 1 }));
    writeFileSync(join(dir, 'half.json.tmp'), '{"id":"ha');
    assert.deepEqual(records.readAll(), [{ id: 'kept', n: 1 }]);
    assert.deepEqual(files(dir), ['kept.json']);
  }));

/**
 * A syncer whose syncs wait until released (a slow disk), recording what was synced in order;
 * a file sync can be made to fail.
 */
class HeldSyncer implements Syncer {
  readonly order: string[] = [];
  private readonly waiting: { path: string; release: (err?: Error) => void }[] = [];

  file(path: string): Promise<void> {
    return this.hold(`file ${basename(path)}`);
  }

  dir(path: string): Promise<void> {
    this.order.push(`dir ${basename(path)}`);
    return Promise.resolve();
  }

  get held(): number {
    return this.waiting.length;
  }

  /** Lets the oldest held sync end (with `err`: it fails). */
  release(err?: Error): void {
    this.waiting.shift()?.release(err);
  }

  private hold(what: string): Promise<void> {
    return new Promise((resolve, reject) => {
      this.waiting.push({
        path: what,
        release: (err) => {
          this.order.push(err ? `failed ${what}` : what);
          if (err) reject(err);
          else resolve();
        },
      });
    });
  }
}

const settled = async (p: Promise<unknown>): Promise<boolean> => {
  let done = false;
  void p.then(
    () => (done = true),
    () => (done = true),
  );
  for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
  return done;
};

test("a durable record's content is synced off the event loop, then renamed in, then the folder synced; flush waits for all", () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    records.write({ id: 'a', n: 0 }); // need not outlive the host: in place at once, no sync
    records.write({ id: 'a', n: 1 });
    // write() returned with its content's sync still under way (not an fsync on the loop), and
    // the record it replaces is what a crash would read until then.
    assert.equal(syncer.held, 1);
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 0 }]);
    const flushed = records.flush();
    assert.equal(await settled(flushed), false, 'flush waits for the content sync');
    syncer.release();
    await flushed;
    assert.equal(syncer.order.length, 2);
    assert.match(syncer.order[0]!, /^file a\.json\..*\.tmp$/);
    assert.equal(syncer.order[1], `dir ${basename(dir)}`);
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 1 }]);
    assert.deepEqual(files(dir), ['a.json']);
  }));

test('a durable write superseded while it syncs (written again, removed) does not land over the newer state', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    records.write({ id: 'a', n: 1 });
    records.write({ id: 'a', n: 0 }); // resumed, say: not durable, in place at once
    records.write({ id: 'b', n: 1 });
    records.remove('b');
    records.write({ id: 'c', n: 1 });
    records.write({ id: 'c', n: 2 });
    const flushed = records.flush();
    for (let i = 0; i < 4; i++) syncer.release();
    await flushed;
    assert.deepEqual(
      records.readAll().sort((x, y) => x.id.localeCompare(y.id)),
      [
        { id: 'a', n: 0 },
        { id: 'c', n: 2 },
      ],
    );
    await eventually('the superseded files to go', () => files(dir).length === 2);
    assert.deepEqual(files(dir), ['a.json', 'c.json']);
  }));

test('a failed content sync fails the flush that waits for it, or the next; the old record stays', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    records.write({ id: 'a', n: 0 });
    records.write({ id: 'a', n: 1 });
    const flushed = records.flush();
    syncer.release(new Error('EIO (test)'));
    await assert.rejects(flushed, /EIO/);
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 0 }]);
    // One no flush waited for: the next flush says so, once.
    records.write({ id: 'b', n: 1 });
    syncer.release(new Error('EIO (test)'));
    await eventually('the failure seen', () => syncer.order.length === 2);
    await assert.rejects(records.flush(), /EIO/);
    await records.flush();
    await eventually('the unsynced files to go', () => files(dir).length === 1);
    assert.deepEqual(files(dir), ['a.json']);
  }));

test('flush syncs the folder once for the durable records renamed in before it, and only then', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    await records.flush();
    records.write({ id: 'a', n: 0 }); // need not outlive the host: no folder sync
    await records.flush();
    assert.deepEqual(syncer.order, []);
    records.write({ id: 'b', n: 1 });
    records.write({ id: 'c', n: 1 });
    const both = [records.flush(), records.flush()];
    syncer.release();
    syncer.release();
    await Promise.all(both);
    const dirSyncs = (): number => syncer.order.filter((o) => o.startsWith('dir')).length;
    assert.equal(dirSyncs(), 1, 'one sync serves every record renamed in before it');
    await records.flush();
    assert.equal(dirSyncs(), 1, 'nothing renamed in since: no sync');
    records.write({ id: 'b', n: 2 });
    const again = records.flush();
    syncer.release();
    await again;
    assert.equal(dirSyncs(), 2, 'a record renamed in since needs a sync of its own');
  }));

test('a durable write a crash interrupted before its rename is put in place by the next start when whole, dropped when torn', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const before = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    before.write({ id: 'a', n: 0 });
    before.write({ id: 'b', n: 0 });
    before.write({ id: 'a', n: 1 }); // its sync held: hostd dies here
    before.write({ id: 'b', n: 1 });
    assert.equal(syncer.held, 2);
    // A power cut tore b's.
    const torn = files(dir).find((f) => f.startsWith('b.json.') && f.endsWith('.tmp'))!;
    writeFileSync(join(dir, torn), '{"id":"b","n"');
    const after = new FileRecords<Rec>(dir);
    assert.deepEqual(
      after.readAll().sort((x, y) => x.id.localeCompare(y.id)),
      [
        { id: 'a', n: 1 },
        { id: 'b', n: 0 },
      ],
    );
    assert.deepEqual(files(dir), ['a.json', 'b.json']);
  }));

test('a durable write superseded before its sync opened its file fails no flush: the newer write is the record', () =>
  withDir(async (dir) => {
    // The real syncs: the superseded write's file is gone before its fsync opens it (ENOENT).
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0 });
    records.write({ id: 'a', n: 1 });
    records.write({ id: 'a', n: 2 });
    records.write({ id: 'b', n: 1 });
    records.remove('b');
    await records.flush();
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 2 }]);
    // Nor a later flush, for a record written since.
    records.write({ id: 'c', n: 1 });
    await records.flush();
    await eventually('the superseded files to go', () => files(dir).length === 2);
    assert.deepEqual(files(dir), ['a.json', 'c.json']);
  }));

test('a durable write put in place by the next start is synced before it replaces the durable record', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const before = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 0, syncer });
    before.write({ id: 'a', n: 1 });
    syncer.release();
    await before.flush();
    before.write({ id: 'a', n: 2 }); // its sync held: hostd dies here, the host stays up
    const seen: string[] = [];
    const after = new FileRecords<Rec>(dir, {
      syncer,
      syncNow: (path) => {
        // Synced while a.json is still the durable record it is to replace.
        const now = (JSON.parse(readFileSync(join(dir, 'a.json'), 'utf8')) as Rec).n;
        seen.push(`${basename(path).replace(/\.\d+-\d+\.tmp$/, '.tmp')} over n=${now}`);
      },
    });
    assert.deepEqual(after.readAll(), [{ id: 'a', n: 2 }]);
    assert.deepEqual(seen, ['a.json.tmp over n=1']);
  }));

/** One turn of the event loop: what `openAhead` defers to after the write's turn. */
const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));
const aheadFiles = (dir: string): string[] => files(dir).filter((f) => f.startsWith('.ahead-'));

test('with openAhead, a write goes to the file opened after the last write, which is opened anew', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, { lastsReboot: () => false, openAhead: true });
    records.write({ id: 'a', n: 1 }); // none open yet: its own file, as without openAhead
    assert.deepEqual(files(dir), ['a.json']);
    await nextTurn();
    const [first] = aheadFiles(dir);
    assert.ok(first, 'a file is opened after the write');
    records.write({ id: 'b', n: 1 });
    records.write({ id: 'a', n: 2 }); // same turn: the file ahead is taken, so its own file
    assert.deepEqual(files(dir), ['a.json', 'b.json'], 'the file ahead became b.json');
    assert.deepEqual(JSON.parse(readFileSync(join(dir, 'b.json'), 'utf8')), { id: 'b', n: 1 });
    assert.deepEqual(JSON.parse(readFileSync(join(dir, 'a.json'), 'utf8')), { id: 'a', n: 2 });
    await nextTurn();
    const [second] = aheadFiles(dir);
    assert.ok(second && second !== first, 'the next one is a new file');
    // This run's file ahead is not what a crash left: a read keeps it, and it reads as nothing.
    assert.deepEqual(
      records
        .readAll()
        .map((r) => r.id)
        .sort(),
      ['a', 'b'],
    );
    assert.deepEqual(aheadFiles(dir), [second]);
    // The next start's read drops it with what else a crash left.
    const restarted = new FileRecords<Rec>(dir, { lastsReboot: () => false });
    assert.equal(restarted.readAll().length, 2);
    assert.deepEqual(files(dir), ['a.json', 'b.json']);
    records.closeAhead();
  }));

test('without options every record must outlive the host and no file is opened ahead', () =>
  withDir(async (dir) => {
    const syncer = new HeldSyncer();
    const records = new FileRecords<Rec>(dir, { syncer });
    records.write({ id: 'a', n: 0 });
    assert.equal(syncer.held, 1, 'synced before it is in place, as a durable record is');
    assert.deepEqual(records.readAll(), []);
    syncer.release();
    await records.flush();
    await nextTurn();
    assert.deepEqual(records.readAll(), [{ id: 'a', n: 0 }]);
    assert.deepEqual(aheadFiles(dir), []);
  }));

test('with openAhead, records that must outlive the host are written as without it', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, { lastsReboot: (r) => r.n > 1, openAhead: true });
    records.write({ id: 'a', n: 1 });
    await nextTurn();
    const [ahead] = aheadFiles(dir);
    records.write({ id: 'b', n: 2 }); // durable: its own file, synced, then renamed in
    assert.deepEqual(aheadFiles(dir), [ahead], 'the file ahead waits for a write that is not');
    await records.flush();
    assert.deepEqual(JSON.parse(readFileSync(join(dir, 'b.json'), 'utf8')), { id: 'b', n: 2 });
    records.closeAhead();
  }));

const openFds = (): number => readdirSync('/proc/self/fd').length;

test('closeAhead closes and removes the file opened ahead, and opens no other', () =>
  withDir(async (dir) => {
    const before = openFds();
    const records = new FileRecords<Rec>(dir, { lastsReboot: () => false, openAhead: true });
    records.write({ id: 'a', n: 1 });
    await nextTurn();
    records.write({ id: 'b', n: 1 }); // to the file opened ahead: its descriptor waits a turn
    assert.equal(aheadFiles(dir).length, 0);
    records.closeAhead(); // in the write's turn: its immediate would open the next file
    await nextTurn();
    assert.deepEqual(files(dir), ['a.json', 'b.json'], 'a clean stop leaves no spare file');
    assert.equal(openFds(), before, 'nor a descriptor');
    records.write({ id: 'c', n: 1 }); // a write after it still lands, in its own file
    await nextTurn();
    assert.deepEqual(files(dir), ['a.json', 'b.json', 'c.json']);
    assert.equal(openFds(), before);
  }));

test('a whole record in a spare file a crash left is removed at the next start, never read', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, { lastsReboot: () => false, openAhead: true });
    records.write({ id: 'a', n: 1 });
    // A crash between the write to a file opened ahead and its rename.
    writeFileSync(join(dir, '.ahead-99999-7.tmp'), JSON.stringify({ id: 'z', n: 1 }) + '\n');
    const restarted = new FileRecords<Rec>(dir, { lastsReboot: () => false, openAhead: true });
    assert.deepEqual(restarted.readAll(), [{ id: 'a', n: 1 }]);
    assert.deepEqual(files(dir).filter((f) => f.startsWith('.ahead-')).length, 0);
    records.closeAhead();
    restarted.closeAhead();
  }));
