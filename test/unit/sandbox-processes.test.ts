/**
 * Processes and directory watches of sandboxes, against the fake hypervisor (docs/api.md,
 * "Processes"; core/sandbox-processes.ts): they run beside the exec queue, their streams are
 * pulled at the client's pace and handed back as credit, processes outlive their streams, and
 * what happens to the machine (pause, merge, delete, death) ends the streams with an error that
 * says so.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { isError } from '../../src/errors.js';
import type { ProcessEvent, ProcessRun, ProcessSpec } from '../../src/core/sandbox-manager.js';
import type { FakeMachine } from '../helpers/fake-hypervisor.js';
import { hang, started } from '../helpers/manager.js';
import { eventually } from '../../testkit/eventually.js';

const spec = (cmd: string, fields: Partial<ProcessSpec> = {}): ProcessSpec => ({
  cmd,
  args: [],
  envs: {},
  stdin: false,
  timeoutMs: 0,
  ...fields,
});

async function drain(run: ProcessRun): Promise<ProcessEvent[]> {
  const events: ProcessEvent[] = [];
  for await (const e of run) events.push(e);
  return events;
}

async function sandbox(): Promise<{
  manager: Awaited<ReturnType<typeof started>>['manager'];
  hv: Awaited<ReturnType<typeof started>>['hv'];
  id: string;
}> {
  const { manager, hv } = await started();
  const { id } = await manager.create({});
  return { manager, hv, id };
}

/** The machine running process `pid` (pooled machines run none). */
function machineRunning(hv: Awaited<ReturnType<typeof started>>['hv'], pid: number): FakeMachine {
  return hv.machines.find((m) => m.alive && m.procs.processes.has(pid))!;
}

describe('processes', () => {
  test('a process starts with its pid known, then streams its output and its end', async () => {
    const { manager, id } = await sandbox();
    const run = await manager.processes.start(id, spec('echo', { args: ['hello'] }));
    assert.ok(run.pid > 0);
    const events = await drain(run);
    assert.deepEqual(
      events.map((e) => (e.type === 'end' ? e.end : [e.type, e.data.toString()])),
      [['stdout', 'hello\n'], { exitCode: 0, signal: null, timedOut: false }],
    );
  });

  test('processes run while an exec holds the sandbox: they wait behind no queue', async () => {
    const { manager, id } = await sandbox();
    const running = await hang(manager, id);
    const run = await manager.processes.start(id, spec('exit', { args: ['3'] }));
    const [end] = await drain(run);
    assert.deepEqual(end, { type: 'end', end: { exitCode: 3, signal: null, timedOut: false } });
    assert.equal(manager.describe(id).busy, true);
    running.stop();
  });

  test('what the consumer pulls is handed back to the guest as credit', async () => {
    const { manager, hv, id } = await sandbox();
    const run = await manager.processes.start(id, spec('cat', { stdin: true }));
    const { procs } = machineRunning(hv, run.pid);
    procs.print(run.pid, 'abc');
    const it = run[Symbol.asyncIterator]();
    assert.equal(procs.consumed.get(run.pid) ?? 0, 0, 'nothing consumed before the pull');
    await it.next();
    assert.equal(procs.consumed.get(run.pid), 4, 'three bytes and the stream byte');
    run.detach();
  });

  test('a process outlives its stream: detach, then connect finds it and gets what follows', async () => {
    const { manager, id } = await sandbox();
    const first = await manager.processes.start(id, spec('cat', { stdin: true }));
    first.detach();
    const listed = await manager.processes.list(id);
    assert.deepEqual(
      listed.map((p) => p.pid),
      [first.pid],
    );
    const again = await manager.processes.connect(id, { pid: first.pid });
    await manager.processes.sendInput(id, { pid: first.pid }, Buffer.from('more'));
    await manager.processes.closeStdin(id, { pid: first.pid });
    const events = await drain(again);
    assert.deepEqual(
      events.map((e) => e.type),
      ['stdout', 'end'],
    );
  });

  test('signals end a process and its stream says which', async () => {
    const { manager, id } = await sandbox();
    const run = await manager.processes.start(id, spec('sleep'));
    await manager.processes.signal(id, { pid: run.pid }, 9);
    const [end] = await drain(run);
    assert.deepEqual(end, { type: 'end', end: { exitCode: null, signal: 9, timedOut: false } });
  });

  test('refusals are registry errors: unknown pid, user, cwd, closed stdin', async () => {
    const { manager, id } = await sandbox();
    await assert.rejects(manager.processes.signal(id, { pid: 4242 }, 9), (err: unknown) =>
      isError(err, 'processNotFound'),
    );
    await assert.rejects(manager.processes.connect(id, { pid: 4242 }), (err: unknown) =>
      isError(err, 'processNotFound'),
    );
    await assert.rejects(
      manager.processes.start(id, spec('echo', { user: 'nobody-here' })),
      (err: unknown) => isError(err, 'unknownUser') && err.message.includes("'nobody-here'"),
    );
    await assert.rejects(
      manager.processes.start(id, spec('echo', { cwd: '/missing' })),
      (err: unknown) =>
        isError(err, 'invalidCwd') && err.message === "cwd '/missing' does not exist",
    );
    const run = await manager.processes.start(id, spec('sleep'));
    await assert.rejects(
      manager.processes.sendInput(id, { pid: run.pid }, Buffer.from('x')),
      (err: unknown) => isError(err, 'stdinClosed'),
    );
    run.detach();
  });

  test('a sandbox whose machine predates the processes port says so', async () => {
    const { manager, hv, id } = await sandbox();
    for (const m of hv.machines) m.hasProcessPort = false;
    await assert.rejects(manager.processes.list(id), (err: unknown) =>
      isError(err, 'processesUnavailable'),
    );
    await assert.rejects(manager.processes.start(id, spec('echo')), (err: unknown) =>
      isError(err, 'processesUnavailable'),
    );
  });
});

describe('processes and the life of the machine', () => {
  test('pausing ends open streams with stream_interrupted; the next operation resumes it', async () => {
    const { manager, id } = await sandbox();
    const run = await manager.processes.start(id, spec('sleep'));
    const events = drain(run);
    await manager.pause(id);
    await assert.rejects(
      events,
      (err: unknown) => isError(err, 'streamInterrupted') && err.message.includes('paused'),
    );
    assert.equal(manager.describe(id).state, 'paused');
    await manager.processes.list(id);
    assert.equal(manager.describe(id).state, 'ready');
  });

  test('deleting the sandbox ends its streams with sandbox_not_found', async () => {
    const { manager, id } = await sandbox();
    const run = await manager.processes.start(id, spec('sleep'));
    const events = drain(run);
    await manager.delete(id);
    await assert.rejects(events, (err: unknown) => isError(err, 'sandboxDeleted'));
  });

  test("a merge ends the streams of the parent's replaced machine", async () => {
    const { manager, id } = await sandbox();
    const run = await manager.processes.start(id, spec('sleep'));
    const [child] = await manager.fork(id, 1);
    const events = drain(run);
    await manager.merge(id, child!.id);
    await assert.rejects(
      events,
      (err: unknown) => isError(err, 'streamInterrupted') && err.message.includes('merge'),
    );
  });

  test('a machine that dies ends its streams', async () => {
    const { manager, hv, id } = await sandbox();
    const run = await manager.processes.start(id, spec('sleep'));
    const machine = machineRunning(hv, run.pid);
    const events = drain(run);
    machine.die('the VM exited (signal SIGKILL)');
    await assert.rejects(events, (err: unknown) => isError(err, 'streamInterrupted'));
  });

  test('stream traffic keeps the sandbox in use', async () => {
    const { manager, hv, id } = await sandbox();
    const run = await manager.processes.start(id, spec('cat', { stdin: true }));
    const before = manager.describe(id).last_used_at;
    await eventually('a millisecond to pass', () => Date.now() > Date.parse(before));
    machineRunning(hv, run.pid).procs.print(run.pid, 'x');
    assert.notEqual(manager.describe(id).last_used_at, before);
    run.detach();
  });
});

describe('watches', () => {
  test('a watch streams batches of events until it is detached', async () => {
    const { manager, hv, id } = await sandbox();
    const run = await manager.processes.watch(id, {
      path: '/tmp',
      recursive: false,
      entries: false,
    });
    assert.equal(run.path, '/tmp');
    for (const m of hv.machines) m.procs.emitEvents([{ name: 'a', type: 'create' }]);
    const it = run[Symbol.asyncIterator]();
    assert.deepEqual((await it.next()).value, [{ name: 'a', type: 'create' }]);
    run.detach();
    assert.equal((await it.next()).done, true);
  });

  test('a missing directory is file_not_found', async () => {
    const { manager, id } = await sandbox();
    await assert.rejects(
      manager.processes.watch(id, { path: '/missing', recursive: false, entries: false }),
      (err: unknown) => isError(err, 'fileNotFound') && err.message.startsWith('/missing'),
    );
  });
});
