import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { capstoneStandIn } from '../../src/vm/host/capstone-stand-in.js';

const QEMU = 'qemu-system-x86_64';

function withCache(fn: (dir: string) => void): void {
  const dir = mkdtempSync(join(tmpdir(), 'hostd-capstone-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("QEMU's dynamic linker takes the stand-in for libcapstone.so.4, built once into the cache", () => {
  withCache((cache) => {
    const standIn = capstoneStandIn(cache, QEMU);
    assert.ok(standIn.dir !== null, standIn.dir === null ? standIn.why : '');
    assert.deepEqual(capstoneStandIn(cache, QEMU), standIn, 'the second start finds it');
    assert.equal(statSync(join(standIn.dir, 'libcapstone.so.4')).mode & 0o777, 0o644);
    const loaded = spawnSync(QEMU, [], {
      encoding: 'utf8',
      env: { LD_TRACE_LOADED_OBJECTS: '1', LD_LIBRARY_PATH: standIn.dir },
    });
    assert.ok(
      loaded.stdout.includes(`libcapstone.so.4 => ${join(standIn.dir, 'libcapstone.so.4')}`),
      loaded.stdout,
    );
  });
});

test('without a compiler, or with a QEMU that does not start with it, there is none, and why', () => {
  withCache((cache) => {
    for (const standIn of [
      capstoneStandIn(cache, QEMU, '/nonexistent/cc'),
      capstoneStandIn(cache, '/bin/false'),
    ]) {
      assert.equal(standIn.dir, null);
      assert.ok(standIn.dir === null && standIn.why.length > 0);
    }
    assert.deepEqual(readdirSync(join(cache, 'qemu-libs')), [], 'a failed build leaves nothing');
  });
});
