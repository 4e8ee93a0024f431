/**
 * ForkStandby's bookkeeping against the fake hypervisor: every target it makes is either taken
 * by a fork or discarded when it closes, so no incoming QEMU outlives hostd.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ForkStandby } from '../../src/core/fork-standby.js';
import { eventually } from '../../testkit/eventually.js';
import { FakeHypervisor, FakeState } from '../helpers/fake-hypervisor.js';

test('a state two templates share gets one target, discarded at close', async () => {
  const hv = new FakeHypervisor();
  const standby = new ForkStandby(hv, 4, () => null);
  const shared = new FakeState('template-python', new Map(), 'python');
  standby.register(shared);
  standby.register(shared); // `cold:recipe=python`: the same build, the same frozen state
  await eventually('the target to be made', () => !standby.filling && standby.vms === 1);
  await standby.close();
  assert.equal(hv.targets.length, 1);
  assert.ok(hv.targets.every((t) => t.discarded));
});

test('a held standby makes no target until it resumes', async () => {
  const hv = new FakeHypervisor();
  const standby = new ForkStandby(hv, 1, () => null);
  standby.hold();
  standby.register(new FakeState('template-python', new Map(), 'python'));
  assert.equal(standby.filling, false);
  assert.equal(hv.targets.length, 0);
  standby.resume();
  await eventually('the target to be made', () => !standby.filling && standby.vms === 1);
  await standby.close();
  assert.ok(hv.targets.every((t) => t.discarded));
});

test("a fork's refill starts only after its delay, and counts as filling until then", async () => {
  const hv = new FakeHypervisor();
  const standby = new ForkStandby(hv, 2, () => null, undefined, 40);
  const base = new FakeState('template-python', new Map(), 'python');
  standby.register(base);
  await eventually('the first target to be made', () => !standby.filling && standby.vms === 1);
  const target = standby.take(base, 2);
  assert.ok(target);
  standby.refillAfterFork();
  standby.refillAfterFork(); // a second fork ending meanwhile schedules nothing more
  // Not as the fork answers: its children need the host's cores for their first exec then.
  assert.equal(hv.targets.length, 1);
  assert.equal(standby.filling, true);
  await eventually('the refill to be made', () => !standby.filling && standby.vms === 2);
  assert.equal(hv.targets.length, 2);
  await target.discard();
  await standby.close();
  assert.ok(hv.targets.every((t) => t.discarded));
});

test('closing the standby cancels a scheduled refill', async (t) => {
  const hv = new FakeHypervisor();
  const standby = new ForkStandby(hv, 1, () => null, undefined, 20);
  const base = new FakeState('template-python', new Map(), 'python');
  standby.register(base);
  await eventually('the first target to be made', () => !standby.filling && standby.vms === 1);
  const target = standby.take(base, 1);
  // The refill's delay on a clock the test moves: past it without waiting on the host's load
  t.mock.timers.enable({ apis: ['setTimeout'] });
  standby.refillAfterFork();
  await standby.close();
  assert.equal(standby.filling, false);
  t.mock.timers.tick(40); // past the delay: nothing may start after close
  assert.equal(hv.targets.length, 1);
  t.mock.timers.reset();
  await target?.discard();
});
