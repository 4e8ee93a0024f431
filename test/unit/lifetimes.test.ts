/**
 * Sandboxes' metadata and lifetimes (docs/api.md, Metadata and lifetime), and the stop events
 * the E2B front cuts connections on, against the fake hypervisor.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { HostdError } from '../../src/errors.js';
import { SandboxManager, type StopReason } from '../../src/core/sandbox-manager.js';
import { memoryRecords, type SandboxRecord, type SnapshotRecord } from '../../src/core/journal.js';
import { hang, run, setup, setupOptions, started } from '../helpers/manager.js';
import { eventually } from '../../testkit/eventually.js';

const gone = (manager: SandboxManager, id: string): boolean => {
  try {
    manager.describe(id);
    return false;
  } catch (err) {
    return err instanceof HostdError && err.entry === 'sandboxNotFound';
  }
};

const secondsLeft = (expiresAt: string | null): number =>
  (new Date(expiresAt!).getTime() - Date.now()) / 1000;

describe('metadata and lifetime', () => {
  test('are shown in the sandbox info; without them, none', async () => {
    const { manager } = await started();
    const plain = manager.describe((await manager.create({ template: 'slim' })).id);
    assert.deepEqual(plain.metadata, {});
    assert.equal(plain.timeout, null);
    assert.equal(plain.on_timeout, null);
    assert.equal(plain.expires_at, null);

    const { id } = await manager.create({
      template: 'slim',
      metadata: { user: 'ada', run: '7' },
      lifetime: { timeoutS: 300, onTimeout: 'pause' },
    });
    const info = manager.describe(id);
    assert.deepEqual(info.metadata, { user: 'ada', run: '7' });
    assert.equal(info.timeout, 300);
    assert.equal(info.on_timeout, 'pause');
    const left = secondsLeft(info.expires_at);
    assert.ok(left > 290 && left <= 300, `${left} s left`);
    await manager.shutdown();
  });

  test('at the end of its lifetime a sandbox is deleted, and says so to stop listeners', async () => {
    const { manager } = await started();
    const stops: [string, StopReason][] = [];
    manager.onSandboxStopped((id, why) => stops.push([id, why]));
    const { id } = await manager.create({
      template: 'slim',
      lifetime: { timeoutS: 0.05, onTimeout: 'delete' },
    });
    const { id: other } = await manager.create({ template: 'slim' });
    await eventually('the sandbox to be deleted', () => gone(manager, id));
    assert.deepEqual(stops, [[id, 'deleted']]);
    assert.equal(manager.describe(other).state, 'ready');
    await manager.shutdown();
  });

  test('with on_timeout pause it is paused (a running exec is interrupted); a resume gives it its lifetime again', async () => {
    const { manager } = await started();
    const { id } = await manager.create({
      template: 'slim',
      lifetime: { timeoutS: 0.2, onTimeout: 'pause' },
    });
    await run(manager, id, 'set kept yes');
    await hang(manager, id);
    await eventually('the sandbox to pause', () => manager.describe(id).state === 'paused');
    assert.equal(manager.describe(id).expires_at, null, 'the clock stops while paused');
    manager.setTimeout(id, 600);
    assert.equal(manager.describe(id).expires_at, null, 'a paused sandbox keeps no end');
    await manager.resume(id);
    const left = secondsLeft(manager.describe(id).expires_at);
    assert.ok(left > 590 && left <= 600, `${left} s left after resume`);
    const out = (await run(manager, id, 'get kept')).filter((e) => e.type === 'stdout');
    assert.equal(out.map((e) => (e as { data: string }).data).join(''), 'yes');
    await manager.shutdown();
  });

  test('setTimeout shortens and extends; extendOnly never shortens; null removes the limit', async () => {
    const { manager } = await started();
    const { id } = await manager.create({
      template: 'slim',
      lifetime: { timeoutS: 300, onTimeout: 'delete' },
    });
    const end = (): number => new Date(manager.describe(id).expires_at!).getTime();
    manager.setTimeout(id, 60);
    assert.ok(secondsLeft(manager.describe(id).expires_at) <= 60);
    const before = end();
    manager.setTimeout(id, 10, { extendOnly: true });
    assert.equal(end(), before, 'a shorter extendOnly leaves the end where it was');
    manager.setTimeout(id, 900, { extendOnly: true });
    assert.ok(end() > before);
    manager.setTimeout(id, null);
    assert.equal(manager.describe(id).expires_at, null);
    assert.equal(manager.describe(id).timeout, null);
    assert.throws(() => manager.setTimeout(id, 0), /timeout must be/);
    assert.throws(() => manager.setTimeout(id, 31 * 24 * 3600), /timeout must be/);
    await manager.shutdown();
  });

  test('a sandbox without a lifetime gets one from setTimeout, deleted at its end by default', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    manager.setTimeout(id, 0.05);
    assert.equal(manager.describe(id).on_timeout, 'delete');
    await eventually('the sandbox to be deleted', () => gone(manager, id));
    await manager.shutdown();
  });

  test('fork children inherit the metadata and the lifetime, from their own start', async () => {
    const { manager } = await started();
    const { id } = await manager.create({
      template: 'slim',
      metadata: { team: 'x' },
      lifetime: { timeoutS: 120, onTimeout: 'pause' },
    });
    const [child] = await manager.fork(id, 1);
    const info = manager.describe(child!.id);
    assert.deepEqual(info.metadata, { team: 'x' });
    assert.equal(info.timeout, 120);
    assert.equal(info.on_timeout, 'pause');
    assert.ok(secondsLeft(info.expires_at) > 110);
    await manager.shutdown();
  });

  test('a sandbox with a lifetime is not paused for being idle', async () => {
    const { manager } = await started({ idleTimeoutS: 60 });
    const { id: kept } = await manager.create({
      template: 'slim',
      lifetime: { timeoutS: 3600, onTimeout: 'delete' },
    });
    const { id: idle } = await manager.create({ template: 'slim' });
    const reaper = (manager as unknown as { reaper: { sweep(now: number): Promise<number> } })
      .reaper;
    assert.equal(await reaper.sweep(Date.now() + 61_000), 1);
    assert.equal(manager.describe(idle).state, 'paused');
    assert.equal(manager.describe(kept).state, 'ready');
    await manager.shutdown();
  });

  test('are kept in the records and come back after a restart', async () => {
    const records = {
      sandboxes: memoryRecords<SandboxRecord>(),
      snapshots: memoryRecords<SnapshotRecord>(),
    };
    const first = setup({ records });
    await first.manager.start();
    const { id } = await first.manager.create({
      template: 'slim',
      metadata: { k: 'v' },
      lifetime: { timeoutS: 900, onTimeout: 'pause' },
    });
    const record = records.sandboxes.map.get(id)!;
    assert.deepEqual(record.metadata, { k: 'v' });
    assert.deepEqual(record.lifetime, { timeout_s: 900, on_timeout: 'pause' });
    assert.equal(typeof record.expires_at, 'string');
    await first.manager.shutdown();

    const second = new SandboxManager(
      { ...setupOptions(), records },
      first.hv,
      pino({ level: 'silent' }),
    );
    await second.start();
    const info = second.describe(id);
    assert.equal(info.state, 'paused');
    assert.deepEqual(info.metadata, { k: 'v' });
    assert.equal(info.timeout, 900);
    assert.equal(info.expires_at, null);
    await second.resume(id);
    assert.ok(secondsLeft(second.describe(id).expires_at) > 890);
    await second.shutdown();
  });
});

describe('stop events', () => {
  test('pause, delete and a dying VM each tell the listeners once', async () => {
    const { manager } = await started();
    const stops: [string, StopReason][] = [];
    const unsubscribe = manager.onSandboxStopped((id, why) => stops.push([id, why]));
    const { id: a } = await manager.create({ template: 'slim' });
    const { id: b } = await manager.create({ template: 'slim' });
    const { id: c } = await manager.create({ template: 'slim' });
    await manager.pause(a);
    await manager.delete(b);
    await run(manager, c, 'die');
    assert.equal(manager.describe(c).state, 'failed');
    assert.deepEqual(stops, [
      [a, 'paused'],
      [b, 'deleted'],
      [c, 'failed'],
    ]);
    unsubscribe();
    await manager.delete(a);
    assert.equal(stops.length, 3, 'an unsubscribed listener hears nothing');
    await manager.shutdown();
  });
});

describe('who paused', () => {
  test('a pause call, the idle timeout, a lifetime and a shutdown each say so; a resume clears it', async () => {
    const records = {
      sandboxes: memoryRecords<SandboxRecord>(),
      snapshots: memoryRecords<SnapshotRecord>(),
    };
    const first = setup({ records, idleTimeoutS: 60 });
    await first.manager.start();
    const m = first.manager;
    const { id: asked } = await m.create({ template: 'slim' });
    const { id: idle } = await m.create({ template: 'slim' });
    const { id: timed } = await m.create({
      template: 'slim',
      lifetime: { timeoutS: 0.05, onTimeout: 'pause' },
    });
    const { id: running } = await m.create({
      template: 'slim',
      lifetime: { timeoutS: 3600, onTimeout: 'delete' },
    });
    assert.equal(m.describe(asked).paused_by, null);
    await m.pause(asked);
    const reaper = (m as unknown as { reaper: { sweep(now: number): Promise<number> } }).reaper;
    await reaper.sweep(Date.now() + 61_000);
    await eventually('the lifetime to pause it', () => m.describe(timed).state === 'paused');
    assert.equal(m.describe(asked).paused_by, 'request');
    assert.equal(m.describe(idle).paused_by, 'idle');
    assert.equal(m.describe(timed).paused_by, 'lifetime');
    await m.pause(idle); // a client's pause of a sandbox hostd paused makes it the client's
    assert.equal(m.describe(idle).paused_by, 'request');
    await m.resume(asked);
    assert.equal(m.describe(asked).paused_by, null);
    await m.shutdown();
    assert.equal(records.sandboxes.map.get(running)!.paused_by, 'shutdown');
    assert.equal(records.sandboxes.map.get(timed)!.paused_by, 'lifetime');

    const second = new SandboxManager(
      { ...setupOptions(), records },
      first.hv,
      pino({ level: 'silent' }),
    );
    await second.start();
    assert.equal(second.describe(running).paused_by, 'shutdown');
    assert.equal(second.describe(timed).paused_by, 'lifetime');
    await second.shutdown();
  });
});

describe('snapshot names', () => {
  test('a snapshot keeps its name; the newest of a name is found by it; unnamed ones are null', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const first = await manager.snapshot(id, 'base-image');
    const unnamed = await manager.snapshot(id);
    const second = await manager.snapshot(id, 'base-image');
    assert.equal(first.name, 'base-image');
    assert.equal(unnamed.name, null);
    assert.equal(manager.snapshotByName('base-image')?.snapshot_id, second.snapshot_id);
    assert.equal(manager.snapshotByName('nothing'), null);
    assert.equal(manager.describeSnapshot(first.snapshot_id).name, 'base-image');
    await manager.shutdown();
  });
});
