/** Sandbox and snapshot ids (core/ids.ts): their form, and no repeat across the entropy refills. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isSandboxId, isSnapshotId, newSandboxId, newSnapshotId } from '../../src/core/ids.js';

test('ids have their form and do not repeat across refills of the cached random bytes', () => {
  const seen = new Set<string>();
  // 64 ids per fill: 300 cross several refills, sandbox and snapshot ids drawing on the same.
  for (let i = 0; i < 300; i++) {
    const sandbox = newSandboxId();
    const snapshot = newSnapshotId();
    assert.ok(isSandboxId(sandbox), sandbox);
    assert.ok(isSnapshotId(snapshot), snapshot);
    for (const random of [sandbox.slice(4), snapshot.slice(5)]) {
      assert.ok(!seen.has(random), `${random} handed out twice`);
      seen.add(random);
    }
  }
});
