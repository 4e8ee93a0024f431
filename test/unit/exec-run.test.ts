/**
 * ExecRun after a cancel, against the fake machine with node's mocked timers (no time passes):
 * a guest slow to end the exec keeps its sandbox as long as it answers pings; one that answers
 * nothing is reported stuck.
 */
import { afterEach, beforeEach, mock, test } from 'node:test';
import assert from 'node:assert/strict';
import { ExecRun, type ExecEvent } from '../../src/core/exec-run.js';
import { FakeHypervisor, FakeMachine, FakeState } from '../helpers/fake-hypervisor.js';

beforeEach(() => mock.timers.enable({ apis: ['setTimeout'] }));
afterEach(() => mock.timers.reset());

/** Lets the promises and microtasks that the timers started run. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await Promise.resolve();
};

async function events(run: ExecRun): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const e of run) out.push(e);
  return out;
}

/** A machine running `deaf`, an exec that a cancel does not end, cancelled by its timeout. */
async function deafExec(): Promise<{ machine: FakeMachine; run: ExecRun; stuck: string[] }> {
  const machine = new FakeMachine(new FakeHypervisor(), new FakeState('s', new Map(), 'python'));
  const stuck: string[] = [];
  const run = new ExecRun(machine, { language: 'python', code: 'deaf', timeoutMs: 1000 }, (why) =>
    stuck.push(why),
  );
  await settle();
  mock.timers.tick(1000); // the timeout: a cancel the guest does not act on
  await settle();
  return { machine, run, stuck };
}

test('a guest slow to end a cancelled exec keeps its sandbox as long as it answers pings', async () => {
  const { machine, run, stuck } = await deafExec();
  for (let round = 1; round <= 5; round++) {
    mock.timers.tick(10_000);
    await settle();
    assert.equal(machine.pings, round, 'asked whether it is alive, every 10 s');
  }
  machine.finish(1, 124); // it ends it at last
  const seen = await events(run);
  assert.deepEqual(
    seen.map((e) => e.data),
    [124],
  );
  assert.deepEqual(stuck, []);
});

test('a guest that answers neither the cancel nor a ping is stuck: the exec fails, its owner is told', async () => {
  const { machine, run, stuck } = await deafExec();
  machine.answersPings = false;
  mock.timers.tick(10_000);
  await settle();
  assert.equal(machine.pings, 1);
  const seen = await events(run);
  const exit = seen.at(-1)!;
  assert.equal(exit.type, 'exit');
  assert.equal(exit.data, -1);
  assert.equal(stuck.length, 1);
  assert.equal(exit.error, stuck[0]);
});

test('no ping while output is paused by a slow client: the exit cannot come then', async () => {
  const machine = new FakeMachine(new FakeHypervisor(), new FakeState('s', new Map(), 'python'));
  const run = new ExecRun(machine, { language: 'python', code: 'deaf', timeoutMs: 1000 }, () =>
    assert.fail('not stuck'),
  );
  await settle();
  // A client that reads nothing: past the high-water mark of buffered events, output pauses
  const sink = machine.running.get(1)!;
  for (let i = 0; i < 300; i++) sink.onOutput('stdout', 'x');
  assert.equal(machine.outputPaused, true);
  mock.timers.tick(1000);
  mock.timers.tick(60_000);
  await settle();
  assert.equal(machine.pings, 0);
  machine.finish(1, 124);
  assert.equal((await events(run)).at(-1)!.data, 124);
});
