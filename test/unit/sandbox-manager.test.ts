/**
 * SandboxManager's rules, against the fake hypervisor: pools, per-sandbox FIFO execs, fork and
 * merge bookkeeping, admission limits, deletes and idle reaping. No VM runs here: each test takes
 * milliseconds, and the real VMs are covered by test/integration.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { HostdError, type ErrorName } from '../../src/errors.js';
import type { ExecEvent } from '../../src/core/exec-run.js';
import { SandboxManager } from '../../src/core/sandbox-manager.js';
import { MAX_MERGES_KEPT } from '../../src/core/sandbox.js';
import { VmError } from '../../src/vm/vm-error.js';
import type { FrozenState } from '../../src/vm/machine.js';
import type { FakeState } from '../helpers/fake-hypervisor.js';
import { hang, run, setup, setupOptions, started } from '../helpers/manager.js';
import {
  memoryRecords,
  type RecordStore,
  type SandboxRecord,
  type SnapshotRecord,
} from '../../src/core/journal.js';
import { eventually } from '../../testkit/eventually.js';

/**
 * Records kept in memory whose `flush` resolves only when the test calls the next of `flushes`,
 * so a test can hold an answer at the point where its record is being made durable.
 */
function heldFlushes<R extends { id: string }>(): {
  records: RecordStore<R>;
  flushes: (() => void)[];
  inner: ReturnType<typeof memoryRecords<R>>;
} {
  const inner = memoryRecords<R>();
  const flushes: (() => void)[] = [];
  const records: RecordStore<R> = {
    write: (r) => inner.write(r),
    remove: (id) => inner.remove(id),
    readAll: () => inner.readAll(),
    flush: () => new Promise<void>((resolve) => flushes.push(resolve)),
  };
  return { records, flushes, inner };
}

const stdout = async (manager: SandboxManager, id: string, code: string): Promise<string> =>
  (await run(manager, id, code))
    .filter((e) => e.type === 'stdout')
    .map((e) => e.data)
    .join('\n');

async function rejectsWith(p: Promise<unknown>, entry: ErrorName): Promise<HostdError> {
  let caught: unknown;
  await p.then(
    () => assert.fail(`expected ${entry}`),
    (err: unknown) => (caught = err),
  );
  assert.ok(caught instanceof HostdError, `not a HostdError: ${String(caught)}`);
  assert.equal(caught.entry, entry);
  return caught;
}

describe('create', () => {
  test('hands out pooled machines, then restores on a miss, and refills the pool', async () => {
    const { manager, hv } = await started();
    await eventually('the pool to fill', () => manager.poolStats()[0]!.ready === 2);
    const ids = [
      (await manager.create({})).id,
      (await manager.create({ template: 'python' })).id,
      (await manager.create({ template: 'python' })).id,
    ];
    assert.equal(new Set(ids).size, 3);
    await eventually('the pool to refill', () => manager.poolStats()[0]!.ready === 2);
    assert.equal(hv.live.length, 5);
    await manager.shutdown();
  });

  test("a sandbox shows its machine's own memory; none while paused", async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    for (const machine of hv.live) machine.memoryMib = 23.4;
    assert.equal(manager.describe(id).memory_mib, 23.4);
    await manager.pause(id);
    assert.equal(manager.describe(id).memory_mib, null);
    await manager.shutdown();
  });

  test('an unknown template is template_not_found and starts nothing', async () => {
    const { manager, hv } = await started();
    const before = hv.machines.length;
    const err = await rejectsWith(manager.create({ template: 'ruby' }), 'templateNotFound');
    assert.equal(err.code, 'template_not_found');
    assert.deepEqual(err.params[1], ['python', 'slim']);
    assert.equal(hv.machines.length, before);
    await manager.shutdown();
  });

  test('the sandbox cap is 429 limit_reached, with a Retry-After', async () => {
    const { manager } = await started({ maxSandboxes: 2 });
    await manager.create({ template: 'slim' });
    await manager.create({ template: 'slim' });
    const err = await rejectsWith(manager.create({ template: 'slim' }), 'sandboxLimit');
    assert.equal(err.status, 429);
    assert.ok(err.retryAfterS! > 0);
    await manager.shutdown();
  });

  test('a host short of memory is 503 insufficient_resources', async () => {
    const { manager, free } = await started();
    free.memAvailableMib = 120; // under one VM (50) plus the reserve (100)
    const err = await rejectsWith(manager.create({ template: 'slim' }), 'insufficientResources');
    assert.equal(err.status, 503);
    await manager.shutdown();
  });

  test('a restore that fails is an executor_error, and the next create works', async () => {
    const { manager, hv } = await started();
    hv.failNextRestores = 1;
    const err = await rejectsWith(manager.create({ template: 'slim' }), 'vmStartFailed');
    assert.equal(err.code, 'executor_error');
    assert.equal(manager.count, 0);
    await manager.create({ template: 'slim' });
    await manager.shutdown();
  });
});

describe('exec', () => {
  test('runs in arrival order, one at a time, and state persists', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const first = await hang(manager, id);
    const second = manager.exec(id, { code: 'set x 1', language: 'python' });
    const third = manager.exec(id, { code: 'get x', language: 'python' });
    await eventually('two execs queued', () => manager.describe(id).queued === 2);
    assert.equal(manager.describe(id).busy, true);
    first.stop(); // the client went away: the exec is cancelled and the queue moves on
    await second;
    const events: ExecEvent[] = [];
    for await (const e of await third) events.push(e);
    assert.deepEqual(
      events.map((e) => [e.type, e.data]),
      [
        ['stdout', '1'],
        ['exit', 0],
      ],
    );
    await manager.shutdown();
  });

  test('more than maxQueuedExecs waiting is 429', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const running = await hang(manager, id);
    const queued = [1, 2, 3].map(() => manager.exec(id, { code: 'print q', language: 'python' }));
    await rejectsWith(manager.exec(id, { code: 'print no', language: 'python' }), 'queueFull');
    running.stop();
    await Promise.all(queued);
    await manager.shutdown();
  });

  test('a client leaving the queue is client_closed_request, and the queue moves on', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const running = await hang(manager, id);
    const ac = new AbortController();
    const leaving = manager.exec(id, {
      code: 'print never',
      language: 'python',
      signal: ac.signal,
    });
    await eventually('the exec to queue', () => manager.describe(id).queued === 1);
    ac.abort();
    const err = await rejectsWith(leaving, 'requestAborted');
    assert.equal(err.code, 'client_closed_request');
    assert.equal(manager.describe(id).queued, 0);
    running.stop();
    assert.equal(await stdout(manager, id, 'print next'), 'next');
    await manager.shutdown();
  });

  test('delete ends a running exec with an executor error and queued ones with 404', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const running = await manager.exec(id, { code: 'hang', language: 'python' });
    const queued = manager.exec(id, { code: 'print x', language: 'python' });
    await eventually('the exec to queue', () => manager.describe(id).queued === 1);
    await manager.delete(id);
    await rejectsWith(queued, 'sandboxDeleted');
    const events: ExecEvent[] = [];
    for await (const e of running) events.push(e);
    const exit = events.at(-1)!;
    assert.equal(exit.type, 'exit');
    assert.equal(exit.data, -1);
    assert.equal(typeof exit.error, 'string');
    await rejectsWith(manager.exec(id, { code: 'x', language: 'python' }), 'sandboxNotFound');
    await manager.shutdown();
  });

  test('a machine that dies makes its sandbox failed; GET still works, exec is 500', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const events = await run(manager, id, 'die');
    assert.equal(events.at(-1)!.data, -1);
    assert.equal(manager.describe(id).state, 'failed');
    assert.equal(typeof manager.describe(id).error, 'string');
    await rejectsWith(manager.exec(id, { code: 'x', language: 'python' }), 'sandboxBroken');
    await manager.delete(id);
    await manager.shutdown();
  });
});

describe('fork', () => {
  test("the start's first fork target is made after the collection of unused states", async () => {
    // The collection deletes any image no state holds, a spare copy still being made included.
    const { manager, hv } = await started();
    assert.deepEqual(hv.targetsAtCollection, [0]);
    await eventually('a fork target to be made', () => hv.targets.length > 0);
    await manager.shutdown();
  });

  test('children inherit the parent state and diverge independently', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create({ template: 'slim' });
    await run(manager, parent, 'set x parent');
    const children = await manager.fork(parent, 3);
    assert.equal(children.length, 3);
    for (const c of children) {
      assert.equal(c.info().parent_id, parent);
      assert.equal(await stdout(manager, c.id, 'get x'), 'parent');
    }
    await run(manager, children[0]!.id, 'set x child');
    assert.equal(await stdout(manager, parent, 'get x'), 'parent');
    assert.equal(await stdout(manager, children[1]!.id, 'get x'), 'parent');
    await manager.shutdown();
  });

  test('n outside 1..32 is invalid_request', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    for (const n of [0, 33, 1.5]) {
      const err = await rejectsWith(manager.fork(id, n), 'invalidField');
      assert.equal(err.params[0], 'n');
    }
    await manager.shutdown();
  });

  test('is all or nothing: one child failing leaves no child and a working parent', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await eventually('the pools to settle', () => manager.poolStats()[0]!.ready === 2);
    const sandboxes = manager.count;
    const machines = hv.live.length;
    hv.failNextRestores = 1;
    const err = await rejectsWith(manager.fork(id, 4), 'forkChildrenFailed');
    assert.equal(err.code, 'executor_error');
    assert.deepEqual(err.params.slice(0, 2), [1, 4]);
    assert.equal(manager.count, sandboxes);
    assert.equal(hv.live.length, machines, 'the three children that started are destroyed');
    assert.equal(await stdout(manager, id, 'print ok'), 'ok');
    await manager.shutdown();
  });

  test("a fork runs at most forkRunAtOnce children's guests at once, the next as one answers", async () => {
    const { manager, hv } = await started({ forkRunAtOnce: 3 });
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('guest');
    const fork = manager.fork(id, 8);
    await eventually('three guests to run', () => hv.waitingAt('guest') === 3);
    assert.equal(hv.guestsRunning, 3, 'the other five wait for a turn');
    hv.release('guest');
    assert.equal((await fork).length, 8);
    assert.equal(hv.guestsPeak, 3);
    await manager.shutdown();
  });

  test('children within forkRunAtOnce all run at once', async () => {
    const { manager, hv } = await started({ forkRunAtOnce: 3 });
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('guest');
    const fork = manager.fork(id, 2);
    await eventually('both guests to run', () => hv.waitingAt('guest') === 2);
    hv.release('guest');
    assert.equal((await fork).length, 2);
    await manager.shutdown();
  });

  test('a child failing in its turn passes the turn on: the fork fails whole, none is left', async () => {
    const { manager, hv } = await started({ forkRunAtOnce: 2 });
    const { id } = await manager.create({ template: 'slim' });
    await eventually('the pools to settle', () => manager.poolStats()[0]!.ready === 2);
    const sandboxes = manager.count;
    const machines = hv.live.length;
    hv.failNextGuests = 1;
    const err = await rejectsWith(manager.fork(id, 6), 'forkChildrenFailed');
    assert.deepEqual(err.params.slice(0, 2), [1, 6]);
    assert.equal(hv.guestsPeak, 2);
    assert.equal(manager.count, sandboxes);
    assert.equal(hv.live.length, machines, 'the five children that started are destroyed');
    await manager.shutdown();
  });

  test('once a child fails, the children still waiting for a turn run no guest: the fork fails at once', async () => {
    const { manager, hv } = await started({ forkRunAtOnce: 1 });
    const { id } = await manager.create({ template: 'slim' });
    await eventually('the pools to settle', () => manager.poolStats()[0]!.ready === 2);
    const machines = hv.live.length;
    hv.hold('guest');
    hv.failNextGuests = 1;
    const fork = rejectsWith(manager.fork(id, 4), 'forkChildrenFailed');
    await eventually('the first guest to run', () => hv.waitingAt('guest') === 1);
    hv.release('guest');
    const err = await fork;
    assert.deepEqual(err.params.slice(0, 2), [1, 4], 'the one that failed, not those that gave up');
    assert.equal(hv.guestsRun, 1, 'the three behind it never ran their guest');
    assert.equal(hv.live.length, machines);
    await manager.shutdown();
  });

  test('children waiting for a turn when hostd stops run no guest', async () => {
    const { manager, hv } = await started({ forkRunAtOnce: 1 });
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('guest');
    const fork = rejectsWith(manager.fork(id, 4), 'shuttingDown');
    await eventually('the first guest to run', () => hv.waitingAt('guest') === 1);
    const stopped = manager.shutdown();
    hv.release('guest');
    await fork;
    await stopped;
    assert.equal(hv.guestsRun, 1, 'the three behind it never ran their guest');
  });

  test('a fork that would pass the sandbox cap starts no child', async () => {
    const { manager, hv } = await started({ maxSandboxes: 4 });
    const { id } = await manager.create({ template: 'slim' });
    const restores = hv.machines.length;
    await rejectsWith(manager.fork(id, 4), 'sandboxLimit');
    assert.equal(hv.machines.length, restores);
    assert.equal((await manager.fork(id, 3)).length, 3);
    await manager.shutdown();
  });

  test('waits its turn behind a running exec', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const running = await hang(manager, id);
    const fork = manager.fork(id, 1);
    await eventually('the fork to queue', () => manager.describe(id).queued === 1);
    assert.equal(hv.captures.length, 0);
    running.stop();
    assert.equal((await fork).length, 1);
    await manager.shutdown();
  });

  test('a fork of a template restore uses the prepared target, sized by the last fork', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await eventually('a target for each template', () => hv.targets.length === 2);
    await manager.fork(id, 3);
    assert.equal(hv.captures.at(-1)!.target, true);
    await eventually('a new target with 3 incoming machines', () =>
      hv.targets.some((t) => !t.discarded && t.incoming === 3),
    );
    await manager.shutdown();
  });

  test('deleting the parent while its fork captures ends the fork with 404', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('capture');
    const fork = manager.fork(id, 2);
    await eventually('the capture to start', () => hv.waitingAt('capture') === 1);
    await manager.delete(id);
    hv.release('capture');
    await rejectsWith(fork, 'sandboxDeleted');
    await manager.shutdown();
  });
});

describe('merge', () => {
  test('the parent id drives the winner machine; the winner id is gone; siblings stay', async () => {
    const { manager, hv } = await started();
    const { id: parent } = await manager.create({ template: 'slim' });
    const [a, b] = await manager.fork(parent, 2);
    await run(manager, a!.id, 'set who a');
    await run(manager, b!.id, 'set who b');
    const parentMachines = hv.live.length;
    const info = await manager.merge(parent, a!.id);
    assert.equal(info.id, parent);
    assert.equal(await stdout(manager, parent, 'get who'), 'a');
    assert.equal(await stdout(manager, b!.id, 'get who'), 'b');
    await rejectsWith(manager.exec(a!.id, { code: 'x', language: 'python' }), 'sandboxNotFound');
    await rejectsWith(manager.merge(parent, a!.id), 'sandboxNotFound');
    await eventually('the old parent machine to go', () => hv.live.length === parentMachines - 1);
    await manager.shutdown();
  });

  test('the parent remembers each winner merged into it and when, across a restart', async () => {
    const records = {
      sandboxes: memoryRecords<SandboxRecord>(),
      snapshots: memoryRecords<SnapshotRecord>(),
    };
    const first = setup({ records });
    await first.manager.start();
    const { id: parent } = await first.manager.create({ template: 'slim' });
    assert.deepEqual(first.manager.describe(parent).merged_from, []);
    const [a] = await first.manager.fork(parent, 1);
    const before = Date.now();
    await first.manager.merge(parent, a!.id);
    const [b] = await first.manager.fork(parent, 1);
    await first.manager.merge(parent, b!.id);
    const merged = first.manager.describe(parent).merged_from;
    assert.deepEqual(
      merged.map((m) => m.id),
      [a!.id, b!.id],
    );
    assert.ok(Date.parse(merged[0]!.merged_at) >= before - 1000);
    await first.manager.shutdown();

    const second = new SandboxManager(
      { ...setupOptions(), records },
      first.hv,
      pino({ level: 'silent' }),
    );
    await second.start();
    assert.deepEqual(second.describe(parent).merged_from, merged);
    await second.shutdown();
  });

  test('a parent keeps only its most recent merges', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create({ template: 'slim' });
    const winners: string[] = [];
    for (let i = 0; i < MAX_MERGES_KEPT + 2; i++) {
      const [w] = await manager.fork(parent, 1);
      await manager.merge(parent, w!.id);
      winners.push(w!.id);
    }
    assert.deepEqual(
      manager.describe(parent).merged_from.map((m) => m.id),
      winners.slice(-MAX_MERGES_KEPT),
    );
    await manager.shutdown();
  });

  test('into itself is merge_into_self; unknown ids are sandbox_not_found', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await rejectsWith(manager.merge(id, id), 'mergeIntoSelf');
    await rejectsWith(manager.merge(id, `sbx_${'f'.repeat(32)}`), 'sandboxNotFound');
    await manager.shutdown();
  });

  test('execs queued on the parent after the merge run on the adopted machine', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create({ template: 'slim' });
    await run(manager, parent, 'set v old');
    const [w] = await manager.fork(parent, 1);
    await run(manager, w!.id, 'set v new');
    const running = await hang(manager, parent);
    const merge = manager.merge(parent, w!.id);
    const after = manager.exec(parent, { code: 'get v', language: 'python' });
    await eventually('merge and exec to queue', () => manager.describe(parent).queued === 2);
    running.stop();
    await merge;
    const events: ExecEvent[] = [];
    for await (const e of await after) events.push(e);
    assert.equal(events[0]!.data, 'new');
    await manager.shutdown();
  });

  test('two merges in opposite directions do not deadlock: the first wins', async () => {
    const { manager } = await started();
    const { id: x } = await manager.create({ template: 'slim' });
    const { id: y } = await manager.create({ template: 'slim' });
    const runningX = await hang(manager, x);
    const xy = manager.merge(x, y);
    const yx = manager.merge(y, x);
    runningX.stop();
    await xy;
    await rejectsWith(yx, 'sandboxMergedAway');
    assert.equal(manager.describe(x).id, x);
    await manager.shutdown();
  });

  test('merging a failed winner is 500 and changes nothing', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create({ template: 'slim' });
    const [w] = await manager.fork(parent, 1);
    await run(manager, w!.id, 'die');
    await rejectsWith(manager.merge(parent, w!.id), 'sandboxBroken');
    assert.equal(await stdout(manager, parent, 'print alive'), 'alive');
    await manager.shutdown();
  });
});

describe('lifecycle', () => {
  test('idle sandboxes are paused, busy ones never; paused ones past their TTL are deleted', async () => {
    const { manager } = await started({ idleTimeoutS: 60, pausedTtlS: 600 });
    const { id: idle } = await manager.create({ template: 'slim' });
    await run(manager, idle, 'set kept yes');
    const { id: busy } = await manager.create({ template: 'slim' });
    const running = await hang(manager, busy);
    const reaper = (manager as unknown as { reaper: { sweep(now: number): Promise<number> } })
      .reaper;
    assert.equal(await reaper.sweep(Date.now() + 61_000), 1);
    assert.equal(manager.describe(idle).state, 'paused');
    assert.equal(manager.describe(busy).busy, true);
    assert.equal(await reaper.sweep(Date.now() + 601_000), 1);
    await rejectsWith(
      Promise.resolve().then(() => manager.describe(idle)),
      'sandboxNotFound',
    );
    running.stop();
    await manager.shutdown();
  });

  test('with idleAction delete, idle sandboxes are deleted', async () => {
    const { manager } = await started({ idleTimeoutS: 60, idleAction: 'delete' });
    const { id } = await manager.create({ template: 'slim' });
    const reaper = (manager as unknown as { reaper: { sweep(now: number): Promise<number> } })
      .reaper;
    assert.equal(await reaper.sweep(Date.now() + 61_000), 1);
    await rejectsWith(
      Promise.resolve().then(() => manager.describe(id)),
      'sandboxNotFound',
    );
    await manager.shutdown();
  });

  test('shutdown destroys every machine and refuses new work with shutting_down', async () => {
    const { manager, hv } = await started();
    await manager.create({ template: 'slim' });
    await manager.shutdown();
    assert.equal(hv.live.length, 0);
    await rejectsWith(manager.create({ template: 'slim' }), 'shuttingDown');
  });
});

describe('snapshots', () => {
  test('a snapshot keeps the state; sandboxes made from it start there, any number of times', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await run(manager, id, 'set x kept');
    const snap = await manager.snapshot(id);
    assert.match(snap.snapshot_id, /^snap_[0-9a-f]{32}$/);
    assert.equal(snap.source_sandbox_id, id);
    assert.equal(snap.template, 'slim');
    await run(manager, id, 'set x changed');
    for (let i = 0; i < 2; i++) {
      const copy = await manager.create({ snapshot: snap.snapshot_id });
      assert.equal(copy.info().snapshot_id, snap.snapshot_id);
      assert.equal(await stdout(manager, copy.id, 'get x'), 'kept');
    }
    assert.equal(manager.describeSnapshot(snap.snapshot_id).sandboxes, 2);
    assert.deepEqual(
      manager.listSnapshots().map((s) => s.snapshot_id),
      [snap.snapshot_id],
    );
    await manager.shutdown();
  });

  test("a snapshot takes a fork's prepared image when one is ready, and another is made", async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await eventually('a target for each template', () => hv.targets.length === 2);
    const made = hv.targets.length;
    await run(manager, id, 'set x kept');
    const snap = await manager.snapshot(id);
    assert.equal(hv.captures.at(-1)!.target, true);
    assert.equal(
      await stdout(manager, (await manager.create({ snapshot: snap.snapshot_id })).id, 'get x'),
      'kept',
    );
    await eventually('the next target', () =>
      hv.targets.slice(made).some((t) => !t.discarded && t.incoming === 1),
    );
    await manager.shutdown();
  });

  test("a snapshot leaves a wide fork's prepared target to the next fork", async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await eventually('a target for each template', () => hv.targets.length === 2);
    await manager.fork(id, 3); // forks of this template are 3 wide from now on
    await eventually('a new target with 3 incoming machines', () =>
      hv.targets.some((t) => !t.discarded && t.incoming === 3),
    );
    await manager.snapshot(id);
    assert.equal(hv.captures.at(-1)!.target, false);
    await manager.fork(id, 3);
    assert.equal(hv.captures.at(-1)!.target, true);
    await manager.shutdown();
  });

  test('deleting a snapshot leaves the sandboxes made from it running', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const snap = await manager.snapshot(id);
    const copy = await manager.create({ snapshot: snap.snapshot_id });
    manager.deleteSnapshot(snap.snapshot_id);
    await rejectsWith(manager.create({ snapshot: snap.snapshot_id }), 'snapshotNotFound');
    assert.equal(await stdout(manager, copy.id, 'print alive'), 'alive');
    await manager.shutdown();
  });

  test('a snapshot is recorded only once its files are durable, and answered once its record is; the sandbox runs on meanwhile', async () => {
    const { records: held, flushes, inner: snapshots } = heldFlushes<SnapshotRecord>();
    const { manager, hv } = await started({
      records: { sandboxes: memoryRecords<SandboxRecord>(), snapshots: held },
    });
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('persist');
    let answered = false;
    const snap = manager.snapshot(id).then((s) => {
      answered = true;
      return s;
    });
    await eventually(
      'the capture to wait for its files to be synced',
      () => hv.waitingAt('persist') === 1,
    );
    assert.equal(snapshots.map.size, 0, 'no record before the files are durable');
    assert.equal(await stdout(manager, id, 'print runs'), 'runs', 'the sandbox takes execs');
    hv.release('persist');
    await eventually('the record written', () => snapshots.map.size === 1 && flushes.length === 1);
    assert.equal(answered, false, 'no answer before the record is durable');
    assert.deepEqual(manager.listSnapshots(), [], 'not listed before the record is durable');
    flushes.shift()!();
    const info = await snap;
    assert.deepEqual(hv.persisted, [snapshots.map.get(info.snapshot_id)!.state.id]);
    assert.equal(manager.listSnapshots().length, 1);
    await manager.shutdown();
  });

  test('a snapshot whose record cannot be synced, nor then removed, lets go of its state', async () => {
    const snapshots = memoryRecords<SnapshotRecord>();
    const failing: RecordStore<SnapshotRecord> = {
      write: (r) => snapshots.write(r),
      remove: () => {
        throw new Error('EIO'); // the disk that failed the sync fails the rename too
      },
      readAll: () => snapshots.readAll(),
      flush: () => Promise.reject(new Error('EIO')),
    };
    const { manager, hv } = await started({
      records: { sandboxes: memoryRecords<SandboxRecord>(), snapshots: failing },
    });
    const { id } = await manager.create({ template: 'slim' });
    const states: FrozenState[] = [];
    const persist = hv.persistState.bind(hv);
    hv.persistState = (state) => {
      states.push(state);
      return persist(state);
    };
    await assert.rejects(manager.snapshot(id));
    assert.equal(states.length, 1);
    assert.equal((states[0] as FakeState).refs, 0, 'its reference is let go');
    assert.deepEqual(manager.listSnapshots(), []);
    await manager.shutdown();
  });

  test('past the storage cap, a snapshot is 507 and nothing is kept', async () => {
    const { manager } = await started({ maxStorageMib: 15 });
    const { id } = await manager.create({ template: 'slim' });
    await manager.snapshot(id); // 10 MiB of the fake's
    const err = await rejectsWith(manager.snapshot(id), 'storageLimit');
    assert.equal(err.status, 507);
    assert.equal(manager.listSnapshots().length, 1);
    await manager.shutdown();
  });

  test('shutdown waits for a snapshot syncing its files: it is answered, as one captured before a pause', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('persist');
    let answered = false;
    const snap = manager.snapshot(id).then((s) => {
      answered = true;
      return s;
    });
    await eventually('the snapshot to sync its files', () => hv.waitingAt('persist') === 1);
    let answeredFirst: boolean | null = null;
    const stopped = manager.shutdown().then(() => {
      answeredFirst = answered;
    });
    await eventually('the sandbox paused for the next start', () => {
      return manager.describe(id).state === 'paused';
    });
    hv.release('persist');
    await stopped;
    assert.equal(answeredFirst, true, 'the snapshot was answered before shutdown ended');
    assert.equal((await snap).snapshot_id, manager.listSnapshots()[0]?.snapshot_id);
  });

  test('a snapshot still syncing its files counts against the storage cap', async () => {
    const { manager, hv } = await started({ maxStorageMib: 15 });
    const { id } = await manager.create({ template: 'slim' });
    hv.hold('persist');
    const first = manager.snapshot(id); // 10 MiB of the fake's, synced with the turn released
    await eventually('the first to sync its files', () => hv.waitingAt('persist') === 1);
    const err = await rejectsWith(manager.snapshot(id), 'storageLimit');
    assert.equal(err.status, 507);
    hv.release('persist');
    await first;
    assert.equal(manager.listSnapshots().length, 1);
    assert.equal(manager.storageBytes(), 10 * 1024 * 1024, 'counted once it is kept');
    await manager.shutdown();
  });
});

describe('pause and resume', () => {
  test('a paused sandbox keeps its state; any exec resumes it', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await run(manager, id, 'set x before');
    const live = hv.live.length;
    assert.equal((await manager.pause(id)).state, 'paused');
    assert.equal(hv.live.length, live - 1, 'its machine is stopped');
    assert.equal((await manager.pause(id)).state, 'paused', 'pausing again is a no-op');
    assert.equal(await stdout(manager, id, 'get x'), 'before');
    assert.equal(manager.describe(id).state, 'ready');
    await manager.shutdown();
  });

  test('a pause is answered only once its paused record is durable', async () => {
    const { records: held, flushes, inner: sandboxes } = heldFlushes<SandboxRecord>();
    const { manager } = await started({
      records: { sandboxes: held, snapshots: memoryRecords<SnapshotRecord>() },
    });
    const { id } = await manager.create({ template: 'slim' });
    let answered = false;
    const paused = manager.pause(id).then((info) => {
      answered = true;
      return info;
    });
    await eventually('the paused record written', () => sandboxes.map.get(id)?.state === 'paused');
    await eventually('its sync asked for', () => flushes.length === 1);
    assert.equal(answered, false);
    flushes.shift()!();
    assert.equal((await paused).state, 'paused');
    const shutdown = manager.shutdown();
    await eventually('the shutdown to sync the records', () => flushes.length === 1);
    flushes.shift()!();
    await shutdown;
  });

  test('a pause whose sync fails loses the machine: the pause is 500, the sandbox failed, its execs 500', async () => {
    // What Vm.pause does when syncing its files fails past the pause window (docs/api.md).
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    hv.failNext('pause', new VmError('io', 'fsync: EIO'), 'the sandbox could not be written');
    const err = await rejectsWith(manager.pause(id), 'vmOperationFailed');
    assert.equal(err.status, 500);
    assert.equal(manager.describe(id).state, 'failed');
    await rejectsWith(manager.exec(id, { code: 'x', language: 'python' }), 'sandboxBroken');
    await manager.delete(id);
    await manager.shutdown();
  });

  test('resume and fork resume it too; a paused winner can be merged', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await run(manager, id, 'set x 1');
    await manager.pause(id);
    assert.equal((await manager.resume(id)).state, 'ready');
    await manager.pause(id);
    const [child] = await manager.fork(id, 1);
    assert.equal(await stdout(manager, child!.id, 'get x'), '1');
    await run(manager, child!.id, 'set x 2');
    await manager.pause(child!.id);
    await manager.pause(id);
    await manager.merge(id, child!.id);
    assert.equal(await stdout(manager, id, 'get x'), '2');
    await manager.shutdown();
  });

  test('a resume that fails leaves the sandbox paused, and the next one can work', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await run(manager, id, 'set x 1');
    await manager.pause(id);
    hv.failNextRestores = 1;
    const err = await rejectsWith(
      manager.exec(id, { code: 'get x', language: 'python' }),
      'vmOperationFailed',
    );
    assert.equal(err.code, 'executor_error');
    assert.equal(manager.describe(id).state, 'paused');
    assert.equal(await stdout(manager, id, 'get x'), '1');
    await manager.shutdown();
  });

  test('shutdown interrupts running execs and pauses every sandbox; the next start has them', async () => {
    const records = {
      sandboxes: memoryRecords<SandboxRecord>(),
      snapshots: memoryRecords<SnapshotRecord>(),
    };
    const first = setup({ records });
    await first.manager.start();
    const { id: a } = await first.manager.create({ template: 'slim' });
    const { id: b } = await first.manager.create({ template: 'slim' });
    await run(first.manager, a, 'set who a');
    await run(first.manager, b, 'set who b');
    const snap = await first.manager.snapshot(a);
    const events: ExecEvent[] = [];
    const reading = (async () => {
      for await (const e of await first.manager.exec(b, { code: 'hang', language: 'python' }))
        events.push(e);
    })();
    await eventually('the exec to run', () => first.hv.machines.some((m) => m.running.size > 0));
    await first.manager.shutdown();
    await reading;
    assert.equal(events.at(-1)!.type, 'exit', 'the running exec ended for its client');
    assert.equal(first.hv.live.length, 0);

    // The next start, on the same records and "disk".
    const second = new SandboxManager(
      { ...setupOptions(), records },
      first.hv,
      pino({ level: 'silent' }),
    );
    await second.start();
    assert.deepEqual(
      second
        .list()
        .map((s) => [s.id, s.state])
        .sort(),
      [
        [a, 'paused'],
        [b, 'paused'],
      ].sort(),
    );
    assert.equal(await stdout(second, a, 'get who'), 'a');
    assert.equal(await stdout(second, b, 'get who'), 'b');
    const copy = await second.create({ snapshot: snap.snapshot_id });
    assert.equal(await stdout(second, copy.id, 'get who'), 'a');
    await second.shutdown();
  });

  test('after a crash, running VMs are re-adopted with their state; a dead one is lost (410)', async () => {
    const records = {
      sandboxes: memoryRecords<SandboxRecord>(),
      snapshots: memoryRecords<SnapshotRecord>(),
    };
    const first = setup({ records });
    await first.manager.start();
    const { id: survivor } = await first.manager.create({ template: 'slim' });
    const { id: victim } = await first.manager.create({ template: 'slim' });
    await run(first.manager, survivor, 'set x kept');
    void first.manager.exec(survivor, { code: 'hang', language: 'python' });
    await eventually('the exec to run', () => first.hv.machines.some((m) => m.running.size > 0));
    const pooled = first.hv.live.length - 2;
    assert.ok(pooled > 0, 'the first hostd had pooled VMs');
    // The crash: no shutdown; one VM dies meanwhile.
    const victimVm = records.sandboxes.map.get(victim)!.vm;
    first.hv.live.find((m) => m.id === victimVm)!.die('killed');
    const second = new SandboxManager(
      { ...setupOptions(), records },
      first.hv,
      pino({ level: 'silent' }),
    );
    await second.start();
    assert.equal(second.describe(survivor).state, 'ready');
    assert.equal(await stdout(second, survivor, 'get x'), 'kept', 'the running exec was ended');
    const err = await rejectsWith(
      Promise.resolve().then(() => second.describe(victim)),
      'sandboxLost',
    );
    assert.equal(err.status, 410);
    await second.delete(victim);
    await rejectsWith(
      Promise.resolve().then(() => second.describe(victim)),
      'sandboxNotFound',
    );
    await second.shutdown();
  });
});

describe('environment and rich outputs', () => {
  test('the create env is the default of every exec; an exec env goes over it', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim', env: { GREETING: 'hi', LANG: 'C' } });
    assert.equal(await stdout(manager, id, 'env GREETING'), 'hi');
    const events: ExecEvent[] = [];
    for await (const e of await manager.exec(id, {
      code: 'env GREETING',
      language: 'python',
      env: { GREETING: 'over' },
    }))
      events.push(e);
    assert.equal(events[0]!.data, 'over');
    await manager.shutdown();
  });

  test('display bundles are events of their own, in order with the output', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const events = await run(manager, id, 'show a chart');
    assert.deepEqual(
      events.map((e) => [e.type, e.data]),
      [
        ['display', { 'text/plain': 'a chart' }],
        ['exit', 0],
      ],
    );
    await manager.shutdown();
  });
});

describe('notebook cells and contexts', () => {
  const events = async (
    manager: SandboxManager,
    id: string,
    code: string,
    options: { context?: string; notebook?: boolean } = {},
  ): Promise<ExecEvent[]> => {
    const out: ExecEvent[] = [];
    const execRun = await manager.exec(id, { code, language: 'python', ...options });
    await execRun.started;
    for await (const e of execRun) out.push(e);
    return out;
  };

  test('a notebook cell starts with its execution count, then its result or error', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const first = await events(manager, id, 'value 2', { notebook: true });
    assert.deepEqual(
      first.map((e) => [e.type, e.data]),
      [
        ['execution_count', 1],
        ['result', { 'text/plain': '2' }],
        ['exit', 0],
      ],
    );
    const second = await events(manager, id, 'raise NameError x', { notebook: true });
    assert.deepEqual(
      second.map((e) => [e.type, e.data]),
      [
        ['execution_count', 2],
        ['error', { name: 'NameError', value: 'x', traceback: 'Traceback' }],
        ['exit', 1],
      ],
    );
    assert.deepEqual(
      (await run(manager, id, 'print 1')).map((e) => e.type),
      ['stdout', 'exit'],
      'a plain exec has no count',
    );
    await manager.shutdown();
  });

  test('contexts are created, listed, restarted and deleted through the sandbox turn', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const created = await manager.contexts.create(id, { context: 'c1', cwd: '/tmp' });
    assert.deepEqual(created, { id: 'c1', cwd: '/tmp', execution_count: 0 });
    await events(manager, id, 'value 1', { context: 'c1', notebook: true });
    assert.deepEqual(
      (await manager.contexts.list(id)).map((c) => [c.id, c.execution_count]),
      [
        ['default', 0],
        ['c1', 1],
      ],
    );
    assert.equal((await manager.contexts.restart(id, 'c1')).execution_count, 0);
    await manager.contexts.delete(id, 'c1');
    assert.deepEqual(
      (await manager.contexts.list(id)).map((c) => c.id),
      ['default'],
    );
    await manager.shutdown();
  });

  test('what the guest refuses becomes registry errors', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await manager.contexts.create(id, { context: 'c1' });
    await rejectsWith(manager.contexts.create(id, { context: 'c1' }), 'contextExists');
    await rejectsWith(manager.contexts.delete(id, 'nope'), 'contextNotFound');
    await rejectsWith(manager.contexts.restart(id, 'nope'), 'contextNotFound');
    await rejectsWith(manager.contexts.delete(id, 'default'), 'contextIsDefault');
    await rejectsWith(manager.contexts.create(id, { cwd: 'relative' }), 'invalidField');
    await rejectsWith(manager.contexts.list('sbx_unknown'), 'sandboxNotFound');
    await manager.shutdown();
  });

  test('an exec in a context the sandbox lacks is context_not_found, and the turn moves on', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    const execRun = await manager.exec(id, { code: 'print 1', language: 'python', context: 'x' });
    const err = await rejectsWith(execRun.started, 'contextNotFound');
    assert.equal(err.status, 404);
    assert.equal(await stdout(manager, id, 'print next'), 'next');
    await manager.shutdown();
  });

  test('fork children have their parent’s contexts', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ template: 'slim' });
    await manager.contexts.create(id, { context: 'c1' });
    const [child] = await manager.fork(id, 1);
    assert.deepEqual(
      (await manager.contexts.list(child!.id)).map((c) => c.id),
      ['default', 'c1'],
    );
    await manager.shutdown();
  });
});
