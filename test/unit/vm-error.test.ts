/**
 * The vm layer's failures: typed by kind and operation, classified by type (never by wording),
 * with a client's words that carry nothing of the raw text; and the pause window, where a guest
 * QEMU will not run again is a lost machine, not a sandbox left `ready` on a stopped guest.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AgentError } from '../../src/vm/channels/agent-channel.js';
import { whileStopped, type GuestRunState } from '../../src/vm/qemu/pause-window.js';
import { QmpError } from '../../src/vm/qemu/qmp.js';
import { VmError } from '../../src/vm/vm-error.js';
import { asVmError, toVmError } from '../../src/vm/qemu/as-vm-error.js';

const RAW = "ENOENT: no such file or directory, open '/var/lib/hostd/images/fork-1.mem'";
const fsError = (): Error => Object.assign(new Error(RAW), { code: 'ENOENT', syscall: 'open' });

describe('VmError', () => {
  test('what is not a VmError is classified by its type, and keeps its text for the log', () => {
    const cases: [unknown, boolean, string][] = [
      [new AgentError('the guest agent did not answer within 10 ms'), true, 'agent_unresponsive'],
      [new QmpError('stop: QEMU did not answer'), true, 'hypervisor'],
      [fsError(), true, 'io'],
      [new Error(RAW), true, 'io'],
      [fsError(), false, 'died'],
    ];
    for (const [err, alive, kind] of cases) {
      const e = toVmError(err, 'capture', 'io', alive);
      assert.equal(e.kind, kind, String(err));
      assert.equal(e.operation, 'capture');
      assert.equal(e.cause, err);
    }
    assert.equal(toVmError(fsError(), 'restore', 'start_failed').kind, 'start_failed');
  });

  test("a client's reason never quotes the raw text; a guest's refusal quotes the guest", () => {
    for (const kind of ['start_failed', 'died', 'io', 'state_corrupt', 'hypervisor'] as const) {
      const e = new VmError(kind, RAW);
      assert.ok(!e.clientReason.includes('/var/lib'), e.clientReason);
      assert.equal(e.message, RAW, 'the raw text stays for the log');
    }
    const refused = new VmError('guest_refused', RAW, { guestDetail: 'no space left on device' });
    assert.equal(refused.clientReason, 'the guest refused it: no space left on device');
  });

  test('a VmError keeps its kind through the boundary, which adds the operation and tail', async () => {
    const inner = new VmError('state_corrupt', RAW, { consoleTail: 'tail' });
    const outer = await asVmError('resume', () => Promise.reject(inner)).catch((e: unknown) => e);
    assert.ok(outer instanceof VmError);
    assert.equal(outer.kind, 'state_corrupt');
    assert.equal(outer.operation, 'resume');
    assert.equal(outer.consoleTail, 'tail');
    const thrown = await asVmError('pause', () => Promise.reject(fsError())).catch((e) => e);
    assert.equal((thrown as VmError).kind, 'io');
    const dead = await asVmError(
      'set_env',
      () => Promise.reject(new AgentError('closed')),
      () => false,
    ).catch((e: unknown) => e);
    assert.equal((dead as VmError).kind, 'died');
  });
});

describe('the pause window', () => {
  /** QEMU's stop and cont as a test scripts them, and what was lost. */
  function guest(contFails: boolean): GuestRunState & { steps: string[]; lost: string[] } {
    const steps: string[] = [];
    const lost: string[] = [];
    return {
      steps,
      lost,
      stop: async () => void steps.push('stop'),
      cont: async () => {
        steps.push('cont');
        if (contFails) throw new QmpError('cont: QMP connection closed');
      },
      lose: (why) => void lost.push(why),
    };
  }

  test('a capture runs the guest again after, whatever happened', async () => {
    const g = guest(false);
    assert.equal(await whileStopped(g, 'always', async () => 'state'), 'state');
    await assert.rejects(
      whileStopped(g, 'always', () => Promise.reject(new Error('copy failed'))),
      /copy failed/,
    );
    assert.deepEqual(g.steps, ['stop', 'cont', 'stop', 'cont']);
    assert.deepEqual(g.lost, []);
  });

  test('a pause runs the guest again only when it failed', async () => {
    const g = guest(false);
    await whileStopped(g, 'on-failure', async () => 'paused');
    await assert.rejects(whileStopped(g, 'on-failure', () => Promise.reject(new Error('disk'))));
    assert.deepEqual(g.steps, ['stop', 'stop', 'cont']);
  });

  test("a failed pause whose guest will not run again loses the machine; the pause's error is thrown", async () => {
    const g = guest(true);
    await assert.rejects(
      whileStopped(g, 'on-failure', () => Promise.reject(new Error('delta: short write'))),
      /delta: short write/,
    );
    assert.equal(g.lost.length, 1, 'the machine is lost, not left stopped');
  });

  test('a capture whose guest will not run again fails as `died` and loses the machine', async () => {
    const g = guest(true);
    const err = await whileStopped(g, 'always', async () => 'state').catch((e: unknown) => e);
    assert.ok(err instanceof VmError);
    assert.equal(err.kind, 'died');
    assert.equal(g.lost.length, 1);
  });
});
