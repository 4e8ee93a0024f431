/**
 * Disk layers are freed exactly when nothing reads them any more (vm/storage/disk-layer.ts), and the
 * store reopens their chains after a restart and collects what no one reopened
 * (vm/storage/disk-store.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { DiskLayer } from '../../src/vm/storage/disk-layer.js';
import { DiskStore } from '../../src/vm/storage/disk-store.js';
import { eventually } from '../../testkit/eventually.js';

function recorder(): { removed: string[]; remove: (p: string) => Promise<void> } {
  const removed: string[] = [];
  return { removed, remove: async (p) => void removed.push(p) };
}

test('a layer is deleted with its last reference, and then lets go of its backing', () => {
  const { removed, remove } = recorder();
  const bottom = new DiskLayer('b', '/d/b.qcow2', null, { remove }).retain();
  const top = new DiskLayer('t', '/d/t.qcow2', bottom.retain(), { remove }).retain();
  bottom.release(); // its first holder goes: the layer above still reads it
  assert.deepEqual(removed, []);
  top.retain();
  top.release();
  assert.deepEqual(removed, []);
  top.release();
  assert.deepEqual(removed, ['/d/t.qcow2', '/d/b.qcow2']);
});

test('a layer two children sit on outlives the first child', () => {
  const { removed, remove } = recorder();
  const shared = new DiskLayer('s', '/d/s.qcow2', null, { remove });
  const a = new DiskLayer('a', '/d/a.qcow2', shared.retain(), { remove }).retain();
  const b = new DiskLayer('b', '/d/b.qcow2', shared.retain(), { remove }).retain();
  a.release();
  assert.deepEqual(removed, ['/d/a.qcow2']);
  b.release();
  assert.deepEqual(removed, ['/d/a.qcow2', '/d/b.qcow2', '/d/s.qcow2']);
});

test('a kept layer (a cached template) is never deleted; extra releases do nothing', () => {
  const { removed, remove } = recorder();
  let freed = 0;
  const t = new DiskLayer('t', '/c/disk.qcow2', null, {
    keep: true,
    remove,
    onFree: () => freed++,
  });
  t.retain().release();
  t.release();
  assert.deepEqual(removed, []);
  assert.equal(freed, 1);
  assert.throws(() => t.retain(), 'a freed layer cannot come back');
});

test('a chain lists its layers bottom first', () => {
  const a = new DiskLayer('a', '/a', null);
  const b = new DiskLayer('b', '/b', a.retain());
  const c = new DiskLayer('c', '/c', b.retain());
  assert.deepEqual(
    c.chain().map((l) => l.id),
    ['a', 'b', 'c'],
  );
});

/**
 * Runs `body` on a store over a new data directory holding one cached template `abc1`, with
 * that template's layer retained, and removes the directory after.
 */
async function withStore(
  body: (first: DiskStore, template: DiskLayer, data: string, templates: string) => Promise<void>,
): Promise<void> {
  const data = await mkdtemp(join(tmpdir(), 'hostd-disks-'));
  try {
    const templates = join(data, 'templates');
    await mkdir(join(templates, 'abc1'), { recursive: true });
    await writeFile(join(templates, 'abc1', 'disk.qcow2'), 'template');
    const first = new DiskStore(data, templates);
    await first.init();
    await body(first, first.templateLayer('abc1').retain(), data, templates);
  } finally {
    await rm(data, { recursive: true, force: true });
  }
}

test('frozen overlays reopen as the same chain after a restart; garbage collection spares them', async () => {
  await withStore(async (first, template, data, templates) => {
    // A VM's overlay over the template is frozen by a fork, then its child's by a snapshot.
    const vm = first.newTopId();
    await writeFile(first.topPath(vm), 'fork point');
    await first.recordTop(vm, template);
    const fork = (await first.freezeTop(vm, template)).retain();
    const child = first.newTopId();
    await writeFile(first.topPath(child), 'snapshot');
    await first.recordTop(child, fork.retain());
    const snap = (await first.freezeTop(child, fork)).retain();
    const orphan = first.newTopId();
    await writeFile(first.topPath(orphan), 'a VM of a run that crashed');

    const second = new DiskStore(data, templates);
    const reopened = await second.open(snap.id);
    assert.deepEqual(
      reopened.chain().map((l) => l.id),
      ['template-abc1', fork.id, snap.id],
    );
    reopened.retain();
    // The VMs of the first store are gone: their overlays' records and the orphan go.
    assert.equal(await second.collectGarbage(), 3);
    assert.ok(!existsSync(second.topPath(orphan)));
    for (const l of reopened.chain()) assert.ok(existsSync(l.path), `${l.id} is kept`);
    reopened.release();
    // Deleting is not awaited by a release: wait for the files to go.
    await eventually('the chain to be deleted', async () => {
      const left = (await readdir(second.dir)).filter((n) => !n.startsWith('.'));
      return left.length === 0;
    });
    assert.ok(existsSync(join(templates, 'abc1', 'disk.qcow2')), 'the template layer is kept');
  });
});

test('opens of one frozen layer at once share its reopening; a record naming itself is refused', async () => {
  await withStore(async (first, template, data, templates) => {
    // A fork point two sandboxes sit on, each with a frozen layer of its own above it.
    const vm = first.newTopId();
    await writeFile(first.topPath(vm), 'fork point');
    await first.recordTop(vm, template);
    const fork = (await first.freezeTop(vm, template)).retain();
    const tops: string[] = [];
    for (const name of ['a', 'b']) {
      const top = first.newTopId();
      await writeFile(first.topPath(top), name);
      await first.recordTop(top, fork.retain());
      tops.push((await first.freezeTop(top, fork)).retain().id);
    }

    // Two sandboxes reopened at once (two hand-overs onto one node, a start): both reach the
    // shared fork point while neither has registered it yet.
    const second = new DiskStore(data, templates);
    const [a, b] = await Promise.all(tops.map((id) => second.open(id)));
    assert.equal(a!.backing, b!.backing, 'one fork point, opened once');
    assert.deepEqual(
      a!.chain().map((l) => l.id),
      ['template-abc1', fork.id, tops[0]],
    );
    const [again, twice] = await Promise.all([second.open(tops[0]!), second.open(tops[0]!)]);
    assert.equal(again, a);
    assert.equal(twice, a);

    // A record whose chain comes back to itself is corrupt, not a layer to open.
    const looped = 'layer-00000000000000ff';
    await writeFile(join(second.dir, `${looped}.qcow2`), 'x');
    await writeFile(join(second.dir, `${looped}.json`), JSON.stringify({ backing: looped }));
    await assert.rejects(second.open(looped));
    await assert.rejects(second.open(looped), 'refused again, not left half open');
  });
});
