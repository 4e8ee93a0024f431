/**
 * The file lane and the network rules of sandboxes, against the fake hypervisor (docs/api.md,
 * Files: "Ordering"; Network): file operations do not wait behind execs, whatever changes the
 * machine waits for the file operation in progress, uploads are bounded, and every machine a
 * sandbox gets enforces its rules.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { HostdError } from '../../src/errors.js';
import { validateAllowOut } from '../../src/core/sandbox-manager.js';
import type { FakeMachine } from '../helpers/fake-hypervisor.js';
import { hang, started } from '../helpers/manager.js';
import { eventually } from '../../testkit/eventually.js';

const never = new AbortController().signal;
const body = (text: string): Readable => Readable.from([Buffer.from(text)]);

async function readText(
  files: Awaited<ReturnType<typeof started>>['manager']['files'],
  id: string,
  path: string,
): Promise<string> {
  const { stream } = await files.read(id, path, never);
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString();
}

describe('the file lane', () => {
  test('a file operation runs while an exec holds the sandbox', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    const running = await hang(manager, id);
    await manager.files.write(id, '/tmp/a', 0o644, body('written'), never);
    assert.equal(await readText(manager.files, id, '/tmp/a'), 'written');
    assert.equal(manager.describe(id).busy, true, 'the exec still holds the exec lane');
    running.stop();
  });

  test('a fork waits for the file operation in progress, and its children see the write', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({});
    // The pool's refill warms its clone's files path (core/pool.ts): held, it would wait too.
    await eventually('the pool to refill', () => manager.poolStats()[0]!.ready === 2);
    hv.hold('file');
    const write = manager.files.write(id, '/tmp/a', 0o644, body('before the fork'), never);
    await eventually('the write to be in the guest', () => hv.waitingAt('file') === 1);
    const fork = manager.fork(id, 1);
    // The fork holds the exec lane and waits for the file lane.
    await eventually('the fork to take the exec lane', () => manager.describe(id).busy);
    assert.equal(hv.captures.length, 0, 'nothing was captured while the write runs');
    hv.release('file');
    await write;
    const [child] = await fork;
    assert.equal(await readText(manager.files, child!.id, '/tmp/a'), 'before the fork');
  });

  test('an upload over SERVICE_MAX_FILE_BYTES is 413 and writes nothing', async () => {
    const { manager } = await started({ maxFileBytes: 10 });
    const { id } = await manager.create({});
    await assert.rejects(
      manager.files.write(id, '/tmp/big', 0o644, body('eleven bytes'), never),
      (err: unknown) => err instanceof HostdError && err.entry === 'fileTooLarge',
    );
    await assert.rejects(
      manager.files.stat(id, '/tmp/big', never),
      (err: unknown) => err instanceof HostdError && err.entry === 'fileNotFound',
    );
  });

  test('a file operation on a paused sandbox resumes it first', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    await manager.files.write(id, '/tmp/kept', 0o644, body('kept'), never);
    await manager.pause(id);
    assert.equal(manager.describe(id).state, 'paused');
    assert.equal(await readText(manager.files, id, '/tmp/kept'), 'kept');
    assert.equal(manager.describe(id).state, 'ready');
  });

  test('a missing file is file_not_found, not sandbox_not_found', async () => {
    const { manager } = await started();
    const { id } = await manager.create({});
    await assert.rejects(
      manager.files.read(id, '/nope', never),
      (err: unknown) => err instanceof HostdError && err.entry === 'fileNotFound',
    );
  });
});

describe('network rules', () => {
  const rules = ['host.hostd.internal:8080', 'pypi.org:443'];

  test('bad rules are invalid_request naming the rule', () => {
    for (const bad of [['a b'], ['host.hostd.internal'], 'x', [7]]) {
      assert.throws(
        () => validateAllowOut(bad),
        (err: unknown) => err instanceof HostdError && err.entry === 'invalidEgressRule',
      );
    }
  });

  test('a new sandbox, its fork children and its resumed machine all enforce its rules', async () => {
    const { manager, hv } = await started();
    const { id } = await manager.create({ allowOut: rules });
    // The newest machine given to a sandbox (pooled machines have no rules yet).
    const machineOf = (): FakeMachine => hv.live.filter((m) => m.network !== null).at(-1)!;
    const own = machineOf();
    assert.deepEqual(own.network?.hostPorts, [8080]);
    assert.equal(own.network?.gate.checkName('pypi.org', 443).allow, true);
    assert.equal(own.network?.gate.checkName('example.com', 443).allow, false);

    const [child] = await manager.fork(id, 1);
    assert.deepEqual(manager.describe(child!.id).network.allow_out, rules);
    assert.deepEqual(machineOf().network?.hostPorts, [8080]);

    await manager.pause(id);
    await manager.resume(id);
    assert.equal(machineOf().network?.gate.checkName('pypi.org', 443).allow, true);
    assert.deepEqual(manager.describe(id).network.allow_out, rules);
  });

  test('a sandbox without rules gets a gate that refuses everything', async () => {
    const { manager, hv } = await started();
    await manager.create({});
    const policy = hv.live.find((m) => m.network !== null)!.network;
    assert.deepEqual(policy?.hostPorts, []);
    assert.equal(policy?.gate.checkName('pypi.org', 443).allow, false);
  });

  test('a snapshot keeps the rules for the sandboxes made from it', async () => {
    const { manager } = await started();
    const { id } = await manager.create({ allowOut: rules });
    const snap = await manager.snapshot(id);
    const made = await manager.create({ snapshot: snap.snapshot_id });
    assert.deepEqual(manager.describe(made.id).network.allow_out, rules);
  });
});
