import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { enableKsm } from '../../src/vm/host/ksm.js';

test('KSM is turned on when off, and never touched when off is asked or it is on', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ksm-'));
  const run = join(dir, 'run');
  try {
    writeFileSync(run, '0\n');
    assert.equal(enableKsm(false, run).outcome, 'left-alone');
    assert.equal(readFileSync(run, 'utf8'), '0\n');
    assert.equal(enableKsm(true, run).outcome, 'enabled');
    assert.equal(readFileSync(run, 'utf8'), '1');
    assert.equal(enableKsm(true, run).outcome, 'already-on');
    assert.equal(enableKsm(true, join(dir, 'missing')).outcome, 'unavailable');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
