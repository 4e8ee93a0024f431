/**
 * The sandbox's state machine (core/sandbox.ts): which transitions exist, which are refused, and
 * what each one tells its host (the journal record written or removed, stop listeners, the
 * lifetime timer). Then the registry on top of it: lost sandboxes, and a late death report.
 * Fake machines: milliseconds.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { fail, HostdError } from '../../src/errors.js';
import {
  IllegalSandboxTransition,
  Sandbox,
  type InitialState,
  type SandboxHost,
  type SandboxStateKind,
  type StopReason,
} from '../../src/core/sandbox.js';
import { SandboxRegistry } from '../../src/core/registry.js';
import { memoryRecords, type SandboxRecord } from '../../src/core/journal.js';
import { newSandboxId } from '../../src/core/ids.js';
import { FakeHypervisor, FakeMachine, FakePaused, FakeState } from '../helpers/fake-hypervisor.js';

/** A host that records what each transition asked of it, in order. */
class RecordingHost implements SandboxHost {
  readonly calls: string[] = [];
  readonly saved: SandboxRecord[] = [];
  save(sandbox: Sandbox): void {
    this.calls.push('save');
    this.saved.push(sandbox.record());
  }
  forget(): void {
    this.calls.push('forget');
  }
  stopped(_sandbox: Sandbox, why: StopReason): void {
    this.calls.push(`stopped:${why}`);
  }
  expiryChanged(): void {
    this.calls.push('expiry');
  }
  take(): string[] {
    return this.calls.splice(0);
  }
}

const hv = new FakeHypervisor();
const origin = new FakeState('template-python', new Map(), 'python');
const machine = (): FakeMachine => new FakeMachine(hv, origin);
const onDisk = (): FakePaused => new FakePaused(hv, new Map(), origin);
const deleted = (): HostdError => fail('sandboxDeleted', 'sb-test');

const lostId = newSandboxId();
const lostRecord: SandboxRecord = {
  id: lostId,
  template: 'python',
  parent_id: null,
  snapshot_id: null,
  created_at: new Date(0).toISOString(),
  state: 'running',
  vm: 'vm-gone',
};

function sandboxIn(
  kind: SandboxStateKind,
  lifetime: { timeoutS: number; onTimeout: 'delete' | 'pause' } | null = null,
): { sandbox: Sandbox; host: RecordingHost } {
  const host = new RecordingHost();
  const initial: InitialState =
    kind === 'paused'
      ? { kind: 'paused', paused: onDisk(), at: new Date(), by: 'request' }
      : kind === 'lost'
        ? { kind: 'lost', why: 'its VM is gone', record: lostRecord }
        : { kind: 'running', machine: machine() };
  const sandbox = new Sandbox(
    'sb-test',
    { template: 'python', parentId: null, snapshotId: null, lifetime },
    initial,
    8,
    host,
  );
  if (kind === 'failed') sandbox.fail(sandbox.machine!, 'the VM exited');
  if (kind === 'deleted') sandbox.delete('the sandbox was deleted', deleted());
  host.take();
  return { sandbox, host };
}

const winner = () => ({
  id: 'sb-winner',
  machine: machine(),
  template: 'python-slim',
  allowOut: ['example.com'],
});

/** Every transition, applied to a sandbox: what it needs as arguments. */
const transitions: Record<string, (s: Sandbox) => unknown> = {
  resume: (s) => s.resume(machine()),
  merge: (s) => s.adoptMerged(winner()),
  pause: (s) => s.pause(onDisk(), 'request'),
  repause: (s) => s.repause('idle'),
  delete: (s) => s.delete('the sandbox was deleted', deleted()),
  setLifetime: (s) => s.setLifetime({ timeoutS: 60, onTimeout: 'delete' }, new Date()),
};

/** Which transitions each state has (anything else is a bug and throws). */
const legal: Record<SandboxStateKind, string[]> = {
  running: ['merge', 'pause', 'delete', 'setLifetime'],
  paused: ['resume', 'merge', 'repause', 'delete', 'setLifetime'],
  failed: ['merge', 'delete', 'setLifetime'],
  lost: ['delete'],
  deleted: [],
};

describe('sandbox states: which transitions exist', () => {
  for (const [from, allowed] of Object.entries(legal) as [SandboxStateKind, string[]][]) {
    for (const [name, apply] of Object.entries(transitions)) {
      const ok = allowed.includes(name);
      test(`${from} --${name}--> ${ok ? 'allowed' : 'refused, state unchanged'}`, () => {
        const { sandbox, host } = sandboxIn(from);
        if (ok) {
          apply(sandbox);
          return;
        }
        const before = sandbox.status;
        assert.throws(
          () => apply(sandbox),
          (err: unknown) =>
            err instanceof IllegalSandboxTransition && err.from === from && err.transition === name,
        );
        assert.equal(sandbox.status, before, 'the state is what it was');
        assert.deepEqual(host.calls, [], 'nothing is journaled or told');
      });
    }
  }
});

describe('sandbox states: what each transition persists and tells', () => {
  test('running -> paused: journaled as paused (with who paused it), listeners told, clock stopped', () => {
    const { sandbox, host } = sandboxIn('running', { timeoutS: 60, onTimeout: 'pause' });
    assert.ok(sandbox.expiresAt, 'a running sandbox with a lifetime has an end');
    const paused = onDisk();
    sandbox.pause(paused, 'idle');
    assert.deepEqual(host.take(), ['save', 'stopped:paused', 'expiry']);
    const record = host.saved.at(-1)!;
    assert.equal(record.state, 'paused');
    assert.equal(record.paused?.id, paused.id);
    assert.equal(record.paused_by, 'idle');
    assert.equal(record.expires_at, null);
    assert.equal(sandbox.info().state, 'paused');
    assert.equal(sandbox.info().paused_by, 'idle');
    assert.equal(sandbox.machine, null);
    assert.equal(sandbox.isRunning(), false);
  });

  test('paused -> running (resume): journaled with its VM, the lifetime starts again whole', () => {
    const { sandbox, host } = sandboxIn('paused', { timeoutS: 60, onTimeout: 'delete' });
    assert.equal(sandbox.info().expires_at, null, 'the clock stops while paused');
    const m = machine();
    sandbox.resume(m);
    assert.deepEqual(host.take(), ['save', 'expiry']);
    const record = host.saved.at(-1)!;
    assert.equal(record.state, 'running');
    assert.equal(record.vm, m.id);
    assert.ok(sandbox.expiresAt && sandbox.expiresAt.getTime() > Date.now() + 50_000);
    assert.equal(sandbox.isRunning() && sandbox.machine, m);
    assert.equal(sandbox.info().paused_by, null);
  });

  test('paused -> paused (repause): journaled only when who paused it changes', () => {
    const { sandbox, host } = sandboxIn('paused');
    sandbox.repause('request');
    assert.deepEqual(host.take(), [], 'already paused by request');
    sandbox.repause('idle');
    assert.deepEqual(host.take(), ['save']);
    assert.equal(host.saved.at(-1)!.paused_by, 'idle');
  });

  test('running -> failed: listeners told, not journaled (the record still names the VM)', () => {
    const { sandbox, host } = sandboxIn('running');
    const m = sandbox.machine!;
    assert.equal(sandbox.fail(m, 'the VM exited'), true);
    assert.deepEqual(host.take(), ['stopped:failed']);
    const info = sandbox.info();
    assert.equal(info.state, 'failed');
    assert.equal(info.error, 'the VM exited');
    assert.equal(info.memory_mib, null);
    assert.equal(sandbox.machine, m, 'kept for its log tail');
    assert.equal(sandbox.record().vm, m.id);
  });

  test('a death reported for a machine it no longer drives changes nothing', () => {
    const { sandbox, host } = sandboxIn('running');
    const old = sandbox.machine!;
    sandbox.adoptMerged(winner());
    host.take();
    assert.equal(sandbox.fail(old, 'the old VM exited'), false);
    assert.equal(sandbox.status.kind, 'running');
    const failed = sandboxIn('failed').sandbox;
    assert.equal(failed.fail(failed.machine!, 'again'), false);
    assert.equal(failed.brokenReason, 'the VM exited', 'the first reason stays');
    const paused = sandboxIn('paused').sandbox;
    assert.equal(paused.fail(machine(), 'late'), false);
    assert.equal(paused.status.kind, 'paused');
  });

  for (const from of ['running', 'paused', 'failed'] as const) {
    test(`${from} -> running (merge): the winner's VM, template, rules and name, in one write`, () => {
      const { sandbox, host } = sandboxIn(from, { timeoutS: 60, onTimeout: 'delete' });
      const w = winner();
      sandbox.adoptMerged(w);
      assert.deepEqual(host.take(), ['save', 'expiry']);
      const record = host.saved.at(-1)!;
      assert.equal(record.state, 'running');
      assert.equal(record.vm, w.machine.id);
      assert.equal(record.template, 'python-slim');
      assert.deepEqual(record.allow_out, ['example.com']);
      assert.deepEqual(
        record.merged_from?.map((m) => m.id),
        ['sb-winner'],
      );
      const info = sandbox.info();
      assert.equal(info.state, 'ready');
      assert.equal(info.error, null);
      assert.ok(info.expires_at, 'it runs, so its lifetime runs');
    });
  }

  for (const from of ['running', 'paused', 'failed'] as const) {
    test(`${from} -> deleted: the record removed, listeners told, waiters refused, what it held returned`, async () => {
      const { sandbox, host } = sandboxIn(from);
      const held = sandbox.status;
      const holding = await sandbox.queue.acquire();
      const waiter = sandbox.queue.acquire().then(
        () => 'granted',
        (err: unknown) => err,
      );
      const was = sandbox.delete('the sandbox was deleted', deleted());
      assert.equal(was, held, 'the caller destroys the machine or files it had');
      assert.deepEqual(host.take(), ['forget', 'stopped:deleted', 'expiry']);
      assert.equal(sandbox.status.kind, 'deleted');
      assert.equal(sandbox.brokenReason, 'the sandbox was deleted');
      assert.equal(sandbox.machine, null);
      assert.equal(sandbox.paused, null);
      assert.ok((await waiter) instanceof HostdError, 'a waiter is refused');
      holding();
      await assert.rejects(sandbox.queue.acquire(), HostdError, 'and so is a later one');
    });
  }

  test('lost -> deleted: only the record goes (a lost sandbox never ran in this hostd)', () => {
    const { sandbox, host } = sandboxIn('lost');
    sandbox.delete('the sandbox was deleted', deleted());
    assert.deepEqual(host.take(), ['forget']);
  });

  test('a lost sandbox keeps its record as it was, marked lost with why', () => {
    const { sandbox } = sandboxIn('lost');
    assert.deepEqual(sandbox.record(), { ...lostRecord, state: 'lost', error: 'its VM is gone' });
  });

  test('setLifetime: journaled; a paused sandbox keeps no end until it runs', () => {
    const at = new Date(Date.now() + 60_000);
    const running = sandboxIn('running');
    running.sandbox.setLifetime({ timeoutS: 60, onTimeout: 'pause' }, at);
    assert.deepEqual(running.host.take(), ['save', 'expiry']);
    assert.equal(running.host.saved.at(-1)!.expires_at, at.toISOString());
    assert.deepEqual(running.host.saved.at(-1)!.lifetime, { timeout_s: 60, on_timeout: 'pause' });
    const paused = sandboxIn('paused');
    paused.sandbox.setLifetime({ timeoutS: 60, onTimeout: 'pause' }, at);
    assert.deepEqual(paused.host.take(), ['save', 'expiry']);
    assert.equal(paused.sandbox.expiresAt, null);
    running.sandbox.setLifetime(null, null);
    assert.equal(running.sandbox.expiresAt, null);
    assert.equal(running.sandbox.info().timeout, null);
  });

  test('a re-adopted VM keeps the end its lifetime had; without one recorded, it starts now', () => {
    const host = new RecordingHost();
    const lifetime = { timeoutS: 60, onTimeout: 'delete' as const };
    const at = new Date(Date.now() + 5_000);
    const make = (expiresAt: Date | null) =>
      new Sandbox(
        'sb-test',
        { template: 'python', parentId: null, snapshotId: null, lifetime },
        { kind: 'running', machine: machine(), expiresAt },
        8,
        host,
      );
    assert.equal(make(at).expiresAt, at);
    assert.ok(make(null).expiresAt!.getTime() > Date.now() + 50_000);
  });
});

describe('registry over sandbox states', () => {
  const setup = () => {
    const journal = memoryRecords<SandboxRecord>();
    const registry = new SandboxRegistry(
      pino({ level: 'silent' }),
      8,
      new FakeHypervisor(),
      async () => undefined,
      journal,
    );
    const stops: string[] = [];
    registry.onStopped((id, why) => stops.push(`${id}:${why}`));
    return { journal, registry, stops };
  };

  test('a lost sandbox answers sandbox_lost, is not listed, and goes with delete', () => {
    const { journal, registry } = setup();
    registry.markLost(lostRecord, 'its VM is gone');
    assert.equal(journal.map.get(lostId)?.state, 'lost');
    assert.equal(registry.has(lostId), true);
    assert.equal(registry.size, 0);
    assert.deepEqual(registry.all(), []);
    assert.throws(
      () => registry.get(lostId, false),
      (err: unknown) => err instanceof HostdError && err.entry === 'sandboxLost',
    );
    assert.equal(registry.forgetLost(lostId), true);
    assert.equal(registry.has(lostId), false);
    assert.equal(journal.map.has(lostId), false);
    assert.equal(registry.forgetLost(lostId), false);
  });

  test('a machine that dies fails its sandbox: journal untouched, listeners told, VM destroyed', () => {
    const { journal, registry, stops } = setup();
    const m = machine();
    const sandbox = registry.adopt(m, { template: 'python', parentId: null, snapshotId: null });
    const written = journal.map.get(sandbox.id);
    assert.equal(written?.vm, m.id);
    m.die('the VM exited');
    assert.equal(sandbox.status.kind, 'failed');
    assert.equal(journal.map.get(sandbox.id), written);
    assert.deepEqual(stops, [`${sandbox.id}:failed`]);
    assert.equal(m.destroyed, true);
    assert.throws(
      () => registry.get(sandbox.id, true),
      (err: unknown) => err instanceof HostdError && err.entry === 'sandboxBroken',
    );
    assert.equal(registry.get(sandbox.id, false).info().state, 'failed');
  });

  test('a deleted sandbox is gone from the index and the journal; its id is not found', () => {
    const { journal, registry, stops } = setup();
    const sandbox = registry.adopt(machine(), {
      template: 'python',
      parentId: null,
      snapshotId: null,
    });
    sandbox.delete('the sandbox was deleted', fail('sandboxDeleted', sandbox.id));
    assert.equal(registry.holds(sandbox), false);
    assert.equal(journal.map.has(sandbox.id), false);
    assert.deepEqual(stops, [`${sandbox.id}:deleted`]);
    assert.throws(
      () => registry.get(sandbox.id, false),
      (err: unknown) => err instanceof HostdError && err.entry === 'sandboxNotFound',
    );
  });

  test('acquire resumes a paused sandbox and hands it over running', async () => {
    const { journal, registry } = setup();
    const sandbox = registry.adopt(machine(), {
      template: 'python',
      parentId: null,
      snapshotId: null,
    });
    sandbox.pause(onDisk(), 'request');
    assert.equal(journal.map.get(sandbox.id)?.state, 'paused');
    const { sandbox: got, release } = await registry.acquire(sandbox.id);
    release();
    assert.equal(got, sandbox);
    assert.equal(got.machine.alive, true);
    assert.equal(journal.map.get(sandbox.id)?.state, 'running');
  });
});
