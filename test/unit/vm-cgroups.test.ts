import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { detectCgroups, staleLeafUids } from '../../src/vm/host/vm-cgroups.js';
import { Jail } from '../../src/vm/host/vm-jail.js';
import { VmUidPool } from '../../src/vm/host/vm-uids.js';

const range = { first: 200000, last: 200009 };

test('a sweep takes the leaves of uids in its range that no VM holds, and nothing else', () => {
  const held = new Set([200001]);
  assert.deepEqual(
    staleLeafUids(
      ['vm-200000', 'vm-200001', 'vm-200009', 'vm-210000', 'vm-x', 'cgroup.procs', 'vm-199999'],
      range,
      (uid) => held.has(uid),
    ),
    // 200001 is a running VM's; 210000 and 199999 belong to another hostd's range.
    [200000, 200009],
  );
});

test(
  "a jail's sweep removes the empty leaves of gone VMs, keeps held and busy ones",
  {
    skip: process.getuid?.() !== 0 && 'detectCgroups wants root',
  },
  async () => {
    // A stand-in cgroup v2 root: plain folders, where a populated leaf cannot be removed either.
    const root = await mkdtemp(join(tmpdir(), 'hostd-cg-'));
    try {
      await writeFile(join(root, 'cgroup.controllers'), 'cpuset cpu io memory pids\n');
      const detected = await detectCgroups(root);
      assert.ok(detected.cgroups);
      const parent = join(root, 'hostd-vms');
      for (const leaf of ['vm-200000', 'vm-200001', 'vm-200002', 'vm-210000']) {
        await mkdir(join(parent, leaf));
      }
      await writeFile(join(parent, 'vm-200002', 'cgroup.procs'), '4242\n'); // still has a process
      const pool = new VmUidPool(range, () => new Set());
      assert.equal(pool.claim(200001), true); // a re-adopted VM's
      const jail = new Jail(pool, 995, { namespaces: true, cgroups: detected.cgroups });
      assert.equal(jail.sweep(), 0, "leaves made a moment ago may be a starting VM's");
      assert.equal(jail.sweep(0), 1);
      assert.deepEqual((await readdir(parent)).filter((n) => n.startsWith('vm-')).sort(), [
        'vm-200001',
        'vm-200002',
        'vm-210000',
      ]);
      // A VM that ends gives its uid back and its leaf goes with it.
      await jail.release(200001);
      assert.equal(existsSync(join(parent, 'vm-200001')), false);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  },
);
