/**
 * Room for copies from other nodes (core/copy-room.ts): what a copy counts against the storage
 * cap, and the refusals asked before any of its files is fetched. The hand-overs and copies that
 * ask it are in test/unit/cluster-move.test.ts.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import { copiedBytes, CopyRoom } from '../../src/core/copy-room.js';
import { asMachineError } from '../../src/core/machine-error.js';
import { toHostdError } from '../../src/errors.js';
import {
  VmError,
  type ExportedPart,
  type PausedManifest,
  type StateManifest,
} from '../../src/vm/machine.js';

const MIB = 1024 * 1024;

const part = (kind: ExportedPart['kind'], id: string, ...sizes: number[]): ExportedPart => ({
  kind,
  id,
  files: sizes.map((size, i) => ({ path: `${id}/${i}`, size, sha256: 'x' })),
});

const state = (id: string) => ({ format: 1, id, spec: {} });

/** A paused machine on a template's boot, with a two-layer disk chain. */
const paused = (ownMib: number): PausedManifest => ({
  format: 1,
  paused: { format: 1, id: 'p1', origin: state('template-k') },
  parts: [
    part('state', 'template-k', 300 * MIB, 1000),
    part('layer', 'l1', 2 * MIB),
    part('layer', 'l2', 3 * MIB),
    part('paused', 'p1', ownMib * MIB, 500),
  ],
});

/** A snapshot's frozen state over a fork point's. */
const snapshot: StateManifest = {
  format: 1,
  state: state('s1'),
  parts: [
    part('state', 'template-k', 300 * MIB),
    part('layer', 'l1', MIB),
    part('state', 's1', 4 * MIB),
  ],
};

const refusal = (fn: () => unknown): { code: string; status: number; message: string } => {
  try {
    fn();
  } catch (err) {
    const e = toHostdError(err, 't');
    return { code: e.code, status: e.status, message: e.message };
  }
  assert.fail('not refused');
};

describe('what a copy counts against the storage cap', () => {
  test("a paused machine's own files and its disk layers, not the frozen state it starts from", () => {
    assert.equal(copiedBytes(paused(10)), 15 * MIB + 500);
  });

  test("a snapshot's frozen state and its layers, not the template boot under it", () => {
    assert.equal(copiedBytes(snapshot), 5 * MIB);
  });
});

describe('room for a copy', () => {
  const room = (used: number, freeMib = 1e6, cap = 100) => {
    const asked: number[] = [];
    const r = new CopyRoom({
      maxStorageMib: cap,
      usedBytes: () => used,
      diskShortage: (mib) => {
        asked.push(mib);
        return mib > freeMib ? `not enough disk space: ${freeMib} MiB free` : null;
      },
    });
    return { r, asked };
  };

  test('one that would pass SERVICE_MAX_STORAGE_MIB is 503 insufficient_resources naming the cap', () => {
    const { r } = room(90 * MIB);
    const e = refusal(() => r.admit(paused(10)));
    assert.deepEqual([e.code, e.status], ['insufficient_resources', 503]);
    assert.match(
      e.message,
      /90 MiB used, 16 MiB more needed, limit 100 MiB \(SERVICE_MAX_STORAGE_MIB\)/,
    );
    // Within the cap it is taken.
    room(80 * MIB).r.admit(paused(10))();
  });

  test('with no cap (0) only the disk is asked', () => {
    const { r, asked } = room(1e12, 1e6, 0);
    r.admit(snapshot)();
    assert.deepEqual(asked, [5]);
  });

  test('one the data directory has no room for is 503 insufficient_resources naming the disk', () => {
    const { r } = room(0, 12);
    const e = refusal(() => r.admit(paused(10)));
    assert.deepEqual([e.code, e.status], ['insufficient_resources', 503]);
    assert.match(e.message, /not enough disk space/);
  });

  test('copies under way count until each is here or given up', () => {
    const { r, asked } = room(70 * MIB);
    const first = r.admit(paused(10)); // 15 MiB and some
    const e = refusal(() => r.admit(paused(10)));
    assert.match(e.message, /86 MiB used/);
    assert.ok(asked[0]! < 16, 'the first asked the disk for itself');
    first();
    first(); // released once only
    const second = r.admit(paused(10));
    second();
    assert.equal(refusal(() => r.admit(paused(40))).code, 'insufficient_resources');
  });
});

test('a template build the image cache has no room for (no_space) is 503 insufficient_resources, no host path', () => {
  const raw =
    'build k of template python needs 700 MiB in the image cache, 5 MiB free (/var/cache/x)';
  const e = asMachineError(
    new VmError('no_space', raw),
    pino({ level: 'silent' }),
    { sandbox: 'sbx_1' },
    'vmOperationFailed',
    'take over the sandbox',
  );
  assert.deepEqual([e.code, e.status], ['insufficient_resources', 503]);
  assert.match(e.message, /not enough disk space/);
  assert.doesNotMatch(e.message, /\/var/);
});
