/**
 * The pool's warm-up of a restored machine's files path (core/pool.ts, `warm`), against the fake
 * hypervisor: with SERVICE_POOL_WARM_FILES (poolWarmFiles), each pooled machine has done one round trip of the file operations a user calls
 * first, and a new sandbox shows nothing of it; a machine whose files warm-up fails is destroyed
 * and replaced, as one whose exec warm-up fails.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WARM_FILE } from '../../src/core/pool.js';
import { FileOpError } from '../../src/vm/machine.js';
import { started } from '../helpers/manager.js';
import { eventually } from '../../testkit/eventually.js';

const ROUND_TRIP = [
  `write ${WARM_FILE}`,
  `write ${WARM_FILE}`,
  `read ${WARM_FILE}`,
  `stat ${WARM_FILE}`,
  'list /tmp',
  `remove ${WARM_FILE}`,
];

test('by default a pooled machine has done no file operation', async () => {
  const { manager, hv } = await started();
  await eventually('the pool to fill', () => manager.poolStats()[0]!.ready === 2);
  for (const machine of hv.live) assert.deepEqual(machine.files.ops, []);
  await manager.shutdown();
});

test('with poolWarmFiles a pooled machine has done a file round trip and a sandbox sees nothing of it', async () => {
  const { manager, hv } = await started({ poolWarmFiles: true });
  await eventually('the pool to fill', () => manager.poolStats()[0]!.ready === 2);
  assert.equal(hv.live.length, 2);
  for (const machine of hv.live) {
    assert.deepEqual(machine.files.ops, ROUND_TRIP);
    assert.ok(![...machine.memory.keys()].some((k) => k.includes(WARM_FILE)));
  }
  const { id } = await manager.create({ template: 'python' });
  const signal = new AbortController().signal;
  const listed = await manager.files.list(id, '/tmp', signal);
  assert.deepEqual(listed, []);
  await assert.rejects(manager.files.stat(id, WARM_FILE, signal), { code: 'file_not_found' });
  await manager.shutdown();
});

test('a machine whose files warm-up fails is destroyed and replaced', async () => {
  const { manager, hv } = await started({ poolWarmFiles: true });
  // Injected before the pool's first refill reaches its files warm-up.
  hv.failNext('file', new FileOpError('io_error', WARM_FILE, 'the disk is full'));
  await eventually('the pool to fill', () => manager.poolStats()[0]!.ready === 2);
  assert.equal(hv.destroyedIds.length, 1);
  assert.equal(hv.live.length, 2);
  for (const machine of hv.live) assert.deepEqual(machine.files.ops, ROUND_TRIP);
  await manager.shutdown();
});
