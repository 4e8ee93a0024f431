import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FileRecords } from '../../src/core/journal.js';
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
    const records = new FileRecords<Rec>(dir, () => false);
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
    const records = new FileRecords<Rec>(dir, () => false);
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
    writeFileSync(join(dir, 'gone.json.123-1.gone'), JSON.stringify({ id: 'gone', n: 1 }));
    writeFileSync(join(dir, 'half.json.tmp'), '{"id":"ha');
    assert.deepEqual(records.readAll(), [{ id: 'kept', n: 1 }]);
    assert.deepEqual(files(dir), ['kept.json']);
  }));

test('flush syncs the folder once for the durable records written before it, and only then', () =>
  withDir(async (dir) => {
    const records = new FileRecords<Rec>(dir, (r) => r.n > 0);
    const idle = records.flush();
    records.write({ id: 'a', n: 0 }); // need not outlive the host: no folder sync
    assert.equal(records.flush(), idle);
    records.write({ id: 'b', n: 1 });
    records.write({ id: 'c', n: 1 });
    const synced = records.flush();
    assert.notEqual(synced, idle, 'a durable record was renamed in: the folder is synced');
    assert.equal(records.flush(), synced, 'one sync serves every record written before it');
    await synced;
    records.write({ id: 'b', n: 2 });
    assert.notEqual(records.flush(), synced, 'a record written since needs a sync of its own');
    await records.flush();
  }));
