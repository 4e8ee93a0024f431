/**
 * VM failures as clients see them: the registry's code and the failure's kind in words, never
 * the raw text (QEMU's words, a file under the data directory), which goes to hostd's log with
 * the sandbox id; and a machine that cannot run again fails its sandbox at once instead of
 * leaving it `ready` with a stopped guest. Route-level, on the fake hypervisor
 * (test/helpers/server.ts scans every answer for host details).
 */
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { clientReason } from '../../src/core/machine-error.js';
import { fail, type HostdError } from '../../src/errors.js';
import { VmError, type VmErrorKind } from '../../src/vm/machine.js';
import { plan } from '../helpers/fake-images.js';
import { capturedLog } from '../helpers/manager.js';
import { errorBody, startServer, type TestServer } from '../helpers/server.js';

/** What QEMU or the file system said: a host path no client may see. */
const RAW = '/var/lib/hostd/paused/pause-0123456789abcdef/memory.delta is truncated';

/** What a client reads of a failure of `kind` (the registry's message quotes it). */
const words = (kind: VmErrorKind): string => new VmError(kind, RAW).clientReason;

/** A failed system call, as Node raises it: its message names the file. */
function fsError(): Error {
  return Object.assign(new Error(`ENOENT: no such file or directory, open '${RAW}'`), {
    code: 'ENOENT',
    syscall: 'open',
  });
}

describe('VM failures', () => {
  let s: TestServer;
  let logged: ReturnType<typeof capturedLog>;
  let id: string;
  beforeEach(async () => {
    logged = capturedLog();
    // No pool: every restore is a request's, never a refill's running beside it.
    const templates = [plan('python', { memoryMib: 512, vcpus: 1, poolSize: 0 })];
    s = await startServer({ templates }, logged.log);
    id = (await s.manager.create({})).id;
  });
  afterEach(() => s.close());

  const post = (path: string, body?: unknown): ReturnType<TestServer['inject']> =>
    s.inject({
      method: 'POST',
      url: path,
      ...(body === undefined ? {} : { payload: body as object }),
    });
  const exec = (code: string): ReturnType<TestServer['inject']> =>
    post(`/v1/sandboxes/${id}/exec`, { code });
  const exitOf = (body: string): { data: number; error?: string } =>
    JSON.parse(body.trim().split('\n').at(-1)!) as { data: number; error?: string };

  /** The log line of the failure: it has the raw text and names the sandbox. */
  const loggedFailure = (sandbox: string): Record<string, unknown> | undefined =>
    logged.lines.find((l) => l.sandbox === sandbox && JSON.stringify(l.err ?? '').includes(RAW));

  test('a failed pause whose guest cannot run again fails the sandbox at once, never a hang', async () => {
    const lost = 'the VM could not be run again after it was stopped';
    s.hv.failNext('pause', new VmError('hypervisor', `cont: ${RAW}`), lost);
    const pause = await post(`/v1/sandboxes/${id}/pause`);
    assert.equal(pause.statusCode, 500);
    const paused = fail('vmOperationFailed', 'pause the sandbox', words('hypervisor'));
    assert.deepEqual(errorBody(pause), paused.toBody());
    const info = JSON.parse((await s.inject({ url: `/v1/sandboxes/${id}` })).body) as {
      state: string;
      error: string;
    };
    assert.deepEqual([info.state, info.error], ['failed', lost]);
    const next = await exec('print 1');
    assert.equal(next.statusCode, 500, 'the next exec is refused, not left to hang');
    assert.equal(errorBody(next).code, 'executor_error');
    assert.ok(loggedFailure(id), 'the raw text is logged with the sandbox id');
  });

  test('a failed pause the guest survives leaves the sandbox running as before', async () => {
    s.hv.failNext('pause', new VmError('io', RAW));
    const pause = await post(`/v1/sandboxes/${id}/pause`);
    assert.equal(pause.statusCode, 500);
    const expected = fail('vmOperationFailed', 'pause the sandbox', words('io'));
    assert.deepEqual(errorBody(pause), expected.toBody());
    const next = await exec('print still here');
    assert.equal(next.statusCode, 200);
    assert.equal(exitOf(next.body).data, 0);
  });

  test('each operation answers the kind of its failure; the log has the raw text', async () => {
    const cases: [string, () => ReturnType<TestServer['inject']>, () => void, HostdError][] = [
      [
        'snapshot',
        () => post(`/v1/sandboxes/${id}/snapshot`),
        () => s.hv.failNext('capture', new VmError('io', RAW)),
        fail('vmOperationFailed', 'snapshot the sandbox', words('io')),
      ],
      [
        'fork (capture)',
        () => post(`/v1/sandboxes/${id}/fork`, { n: 2 }),
        () => s.hv.failNext('capture', new VmError('state_corrupt', RAW)),
        fail('vmOperationFailed', 'capture the parent state', words('state_corrupt')),
      ],
      [
        'fork (one child of two)',
        () => post(`/v1/sandboxes/${id}/fork`, { n: 2 }),
        () => s.hv.failNext('restore', new VmError('start_failed', RAW)),
        fail('forkChildrenFailed', 1, 2, words('start_failed')),
      ],
      [
        'a bug of the vm layer (an untyped error)',
        () => post(`/v1/sandboxes/${id}/snapshot`),
        () => s.hv.failNext('capture', fsError()),
        fail('vmOperationFailed', 'snapshot the sandbox', clientReason(fsError())),
      ],
    ];
    for (const [what, send, arm, expected] of cases) {
      arm();
      const res = await send();
      assert.equal(res.statusCode, 500, `${what}: ${res.body}`);
      assert.deepEqual(errorBody(res), expected.toBody(), what);
      assert.ok(loggedFailure(id), `${what}: the raw text is logged with the sandbox id`);
      logged.lines.length = 0;
    }
  });

  test('a resume that fails answers the kind; the paused sandbox can be resumed later', async () => {
    assert.equal((await post(`/v1/sandboxes/${id}/pause`)).statusCode, 200);
    s.hv.failNext('resume', fsError());
    const res = await exec('print 1');
    assert.equal(res.statusCode, 500);
    const expected = fail('vmOperationFailed', 'resume the sandbox', clientReason(fsError()));
    assert.deepEqual(errorBody(res), expected.toBody());
    assert.ok(loggedFailure(id));
    assert.equal((await exec('print back')).statusCode, 200);
  });

  test("a create whose VM fails answers the kind, and a guest's refusal in its own words", async () => {
    s.hv.failNext('restore', new VmError('start_failed', RAW));
    const create = await post('/v1/sandboxes', {});
    assert.equal(create.statusCode, 500);
    assert.deepEqual(errorBody(create), fail('vmStartFailed', words('start_failed')).toBody());
    const snap = JSON.parse((await post(`/v1/sandboxes/${id}/snapshot`)).body) as {
      snapshot_id: string;
    };
    s.hv.failNext('restore', fsError());
    const fromSnapshot = await post('/v1/sandboxes', { snapshot: snap.snapshot_id });
    assert.equal(fromSnapshot.statusCode, 500);
    const unexpected = fail('vmStartFailed', clientReason(fsError()));
    assert.deepEqual(errorBody(fromSnapshot), unexpected.toBody());
    const refusal = new VmError('guest_refused', RAW, { guestDetail: 'no room' });
    s.hv.failNext('setEnv', refusal);
    const env = await post('/v1/sandboxes', { env: { A: '1' } });
    assert.equal(env.statusCode, 500);
    const refused = fail('vmOperationFailed', 'set the environment', refusal.clientReason);
    assert.deepEqual(errorBody(env), refused.toBody());
  });
});
