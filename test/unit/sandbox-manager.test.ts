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
import { SandboxManager, type ManagerOptions } from '../../src/core/sandbox-manager.js';
import { FakeHypervisor } from '../helpers/fake-hypervisor.js';
import { eventually } from '../../testkit/eventually.js';

const PLENTY = { memAvailableMib: 1e6, stateDirFreeMib: 1e6 };

function setup(overrides: Partial<ManagerOptions> = {}): {
  manager: SandboxManager;
  hv: FakeHypervisor;
  free: { memAvailableMib: number; stateDirFreeMib: number };
} {
  const hv = new FakeHypervisor();
  const free = { ...PLENTY };
  const manager = new SandboxManager(
    {
      templates: [
        { name: 'python', memoryMib: 512, vcpus: 1, poolSize: 2 },
        { name: 'slim', memoryMib: 256, vcpus: 1, poolSize: 0 },
      ],
      maxSandboxes: 10,
      maxQueuedExecs: 3,
      idleTimeoutS: 0,
      minFreeMib: 100,
      maxExecOutputBytes: 1024,
      forkStandbyMax: 4,
      hostFree: () => free,
      refillPauses: { afterFailureMs: 1, whileShortMs: 1 },
      ...overrides,
    },
    hv,
    pino({ level: 'silent' }),
  );
  return { manager, hv, free };
}

async function started(overrides: Partial<ManagerOptions> = {}): Promise<ReturnType<typeof setup>> {
  const s = setup(overrides);
  await s.manager.start();
  return s;
}

/** Runs one exec to its end and returns its events. */
async function run(manager: SandboxManager, id: string, code: string): Promise<ExecEvent[]> {
  const events: ExecEvent[] = [];
  for await (const e of await manager.exec(id, { code, language: 'python' })) events.push(e);
  return events;
}

/** Starts an exec that runs until its client goes away (`stop()`), as a long cell would. */
async function hang(manager: SandboxManager, id: string): Promise<{ stop(): void }> {
  const ac = new AbortController();
  const run = await manager.exec(id, { code: 'hang', language: 'python', signal: ac.signal });
  return { stop: () => (ac.abort(), run.discard()) };
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
      (await manager.create(undefined)).id,
      (await manager.create('python')).id,
      (await manager.create('python')).id,
    ];
    assert.equal(new Set(ids).size, 3);
    await eventually('the pool to refill', () => manager.poolStats()[0]!.ready === 2);
    assert.equal(hv.live.length, 5);
    await manager.shutdown();
  });

  test('an unknown template is template_not_found and starts nothing', async () => {
    const { manager, hv } = await started();
    const before = hv.machines.length;
    const err = await rejectsWith(manager.create('ruby'), 'templateNotFound');
    assert.equal(err.code, 'template_not_found');
    assert.deepEqual(err.params[1], ['python', 'slim']);
    assert.equal(hv.machines.length, before);
    await manager.shutdown();
  });

  test('the sandbox cap is 429 limit_reached, with a Retry-After', async () => {
    const { manager } = await started({ maxSandboxes: 2 });
    await manager.create('slim');
    await manager.create('slim');
    const err = await rejectsWith(manager.create('slim'), 'sandboxLimit');
    assert.equal(err.status, 429);
    assert.ok(err.retryAfterS! > 0);
    await manager.shutdown();
  });

  test('a host short of memory is 503 insufficient_resources', async () => {
    const { manager, free } = await started();
    free.memAvailableMib = 120; // under one VM (50) plus the reserve (100)
    const err = await rejectsWith(manager.create('slim'), 'insufficientResources');
    assert.equal(err.status, 503);
    await manager.shutdown();
  });

  test('a restore that fails is an executor_error, and the next create works', async () => {
    const { manager, hv } = await started();
    hv.failNextRestores = 1;
    const err = await rejectsWith(manager.create('slim'), 'vmStartFailed');
    assert.equal(err.code, 'executor_error');
    assert.equal(manager.count, 0);
    await manager.create('slim');
    await manager.shutdown();
  });
});

describe('exec', () => {
  test('runs in arrival order, one at a time, and state persists', async () => {
    const { manager } = await started();
    const { id } = await manager.create('slim');
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
    const { id } = await manager.create('slim');
    const running = await hang(manager, id);
    const queued = [1, 2, 3].map(() => manager.exec(id, { code: 'print q', language: 'python' }));
    await rejectsWith(manager.exec(id, { code: 'print no', language: 'python' }), 'queueFull');
    running.stop();
    await Promise.all(queued);
    await manager.shutdown();
  });

  test('a client leaving the queue is client_closed_request, and the queue moves on', async () => {
    const { manager } = await started();
    const { id } = await manager.create('slim');
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
    const { id } = await manager.create('slim');
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
    const { id } = await manager.create('slim');
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
  test('children inherit the parent state and diverge independently', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create('slim');
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
    const { id } = await manager.create('slim');
    for (const n of [0, 33, 1.5]) {
      const err = await rejectsWith(manager.fork(id, n), 'invalidField');
      assert.equal(err.params[0], 'n');
    }
    await manager.shutdown();
  });

  test('is all or nothing: one child failing leaves no child and a working parent', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create('slim');
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

  test('a fork that would pass the sandbox cap starts no child', async () => {
    const { manager, hv } = await started({ maxSandboxes: 4 });
    const { id } = await manager.create('slim');
    const restores = hv.machines.length;
    await rejectsWith(manager.fork(id, 4), 'sandboxLimit');
    assert.equal(hv.machines.length, restores);
    assert.equal((await manager.fork(id, 3)).length, 3);
    await manager.shutdown();
  });

  test('waits its turn behind a running exec', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create('slim');
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
    const { id } = await manager.create('slim');
    await eventually('a target for each template', () => hv.targets.length === 2);
    await manager.fork(id, 3);
    assert.equal(hv.captures.at(-1)!.target, true);
    await eventually('a new target with 3 standby machines', () =>
      hv.targets.some((t) => !t.discarded && t.standby === 3),
    );
    await manager.shutdown();
  });

  test('deleting the parent while its fork captures ends the fork with 404', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create('slim');
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
    const { id: parent } = await manager.create('slim');
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

  test('into itself is merge_into_self; unknown ids are sandbox_not_found', async () => {
    const { manager } = await started();
    const { id } = await manager.create('slim');
    await rejectsWith(manager.merge(id, id), 'mergeIntoSelf');
    await rejectsWith(manager.merge(id, `sbx_${'f'.repeat(32)}`), 'sandboxNotFound');
    await manager.shutdown();
  });

  test('execs queued on the parent after the merge run on the adopted machine', async () => {
    const { manager } = await started();
    const { id: parent } = await manager.create('slim');
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
    const { id: x } = await manager.create('slim');
    const { id: y } = await manager.create('slim');
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
    const { id: parent } = await manager.create('slim');
    const [w] = await manager.fork(parent, 1);
    await run(manager, w!.id, 'die');
    await rejectsWith(manager.merge(parent, w!.id), 'sandboxBroken');
    assert.equal(await stdout(manager, parent, 'print alive'), 'alive');
    await manager.shutdown();
  });
});

describe('lifecycle', () => {
  test('idle sandboxes are reaped, busy ones never', async () => {
    const { manager } = await started({ idleTimeoutS: 60 });
    const { id: idle } = await manager.create('slim');
    const { id: busy } = await manager.create('slim');
    const running = await hang(manager, busy);
    const reaper = (manager as unknown as { reaper: { sweep(now: number): Promise<number> } })
      .reaper;
    assert.equal(await reaper.sweep(Date.now() + 61_000), 1);
    await rejectsWith(
      Promise.resolve().then(() => manager.describe(idle)),
      'sandboxNotFound',
    );
    assert.equal(manager.describe(busy).busy, true);
    running.stop();
    await manager.shutdown();
  });

  test('shutdown destroys every machine and refuses new work with shutting_down', async () => {
    const { manager, hv } = await started();
    await manager.create('slim');
    await manager.shutdown();
    assert.equal(hv.live.length, 0);
    await rejectsWith(manager.create('slim'), 'shuttingDown');
  });
});
