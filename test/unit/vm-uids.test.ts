import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import {
  VmUidPool,
  accountsInRange,
  parseIdRange,
  processUids,
} from '../../src/vm/host/vm-uids.js';

const range = { first: 200000, last: 200003 };

test('each VM gets a uid of its own from the range, handed out in turn', () => {
  const pool = new VmUidPool(range, () => new Set());
  assert.deepEqual([pool.allocate(), pool.allocate()], [200000, 200001]);
  pool.release(200000);
  // A freed uid rests while others are free: the next one in turn comes first.
  assert.equal(pool.allocate(), 200002);
  assert.equal(pool.allocate(), 200003);
  assert.equal(pool.allocate(), 200000);
  assert.throws(() => pool.allocate(), /no free uid left in SERVICE_VM_UID_RANGE 200000-200003/);
});

test('a uid that a process still runs as is never handed out', () => {
  const live = new Set([200000, 200002]);
  const pool = new VmUidPool(range, () => live);
  assert.equal(pool.allocate(), 200001);
  assert.equal(pool.allocate(), 200003);
  assert.throws(() => pool.allocate());
  live.clear();
  assert.equal(pool.allocate(), 200000);
});

test("a re-adopted VM keeps its uid; uids outside the range are not the pool's", () => {
  const pool = new VmUidPool(range, () => new Set());
  assert.equal(pool.claim(200000), true);
  assert.equal(pool.claim(995), false);
  assert.equal(pool.allocate(), 200001);
  assert.equal(pool.inUse, 2);
});

test('SERVICE_VM_UID_RANGE is first-last above the system accounts', () => {
  assert.deepEqual(parseIdRange('200000-265535'), { first: 200000, last: 265535 });
  for (const bad of ['', '200000', '5-10', '300-200000x', '200001-200000']) {
    assert.throws(() => parseIdRange(bad), /SERVICE_VM_UID_RANGE/, bad);
  }
});

test('accounts whose uid or gid fall in the range are found', () => {
  const passwd =
    'root:x:0:0::/root:/bin/sh\nsub:x:200001:100::/:/bin/sh\ng:x:1000:200003::/:/bin/sh\n';
  assert.deepEqual(accountsInRange(passwd, range), ['sub', 'g']);
});

test('processUids sees this process', () => {
  assert.ok(processUids().has(process.getuid!()));
});

test('a jailed QEMU joins its cgroup leaf, then new namespaces, then drops to its uid', async () => {
  const { Jail } = await import('../../src/vm/host/vm-jail.js');
  const cgroups = {
    version: 'v2' as const,
    prepare: (uid: number) => Promise.resolve([`/cg/vm-${uid}/cgroup.procs`]),
    remove: () => Promise.resolve(),
    sweep: () => 0,
  };
  const jail = new Jail(new VmUidPool(range, () => new Set()), 995, {
    namespaces: true,
    cgroups,
  });
  const uid = jail.allocate();
  const argv = await jail.enter(uid, { memoryBytes: 1, pids: 1, cpuWeight: 100 }, '/s/vms/vm1');
  const at = (s: string): number => argv.indexOf(s);
  assert.ok(argv.includes('/cg/vm-200000/cgroup.procs'));
  assert.ok(at('/bin/sh') < at('unshare') && at('unshare') < at('setpriv'));
  for (const ns of ['--mount', '--pid', '--net', '--ipc', '--mount-proc', '--fork']) {
    assert.ok(argv.includes(ns), ns);
  }
  assert.deepEqual(argv.slice(at('setpriv')), [
    'setpriv',
    '--reuid',
    '200000',
    '--regid',
    '200000',
    '--groups',
    '995',
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--',
  ]);
  assert.equal(jail.forks, true);
});

test("a jail with a view narrows vms/, the data directory and the cache to the VM's own, before dropping to its uid", async () => {
  const { Jail, viewTable } = await import('../../src/vm/host/vm-jail.js');
  const vmDir = await mkdtemp(join(tmpdir(), 'vm1-'));
  try {
    const jail = new Jail(new VmUidPool(range, () => new Set()), 995, {
      namespaces: true,
      cgroups: null,
      view: {
        vmsDir: dirname(vmDir),
        dataDir: '/d',
        viewsDir: '/d/views',
        narrowed: ['/c'],
        keep: ['/c/libs/1'],
        hide: ['/tmp'],
      },
    });
    const argv = await jail.enter(
      jail.allocate(),
      { memoryBytes: 1, pids: 1, cpuWeight: 100 },
      vmDir,
      ['/c/templates/t/1', '/usr/share/qemu'],
    );
    const view = argv.indexOf('hostd-jail-view');
    assert.ok(argv.indexOf('unshare') < view && view < argv.indexOf('setpriv'));
    const table = join(vmDir, 'jail.fstab');
    // Its own folder, its view, and the cache's folders it opens; the rest is not covered.
    const binds = [vmDir, `/d/views/${basename(vmDir)}`, '/c/libs/1', '/c/templates/t/1'];
    assert.deepEqual(argv.slice(view + 1, view + 7), [table, ...binds, '--']);
    assert.equal(
      await readFile(table, 'utf8'),
      viewTable([dirname(vmDir), '/d', '/c'], binds, ['/tmp']),
    );
  } finally {
    await rm(vmDir, { recursive: true, force: true });
  }
  // Without namespaces (SERVICE_VM_JAIL=uid) there is no mount namespace to build a view in.
  const uidOnly = new Jail(new VmUidPool(range, () => new Set()), 995, {
    namespaces: false,
    cgroups: null,
  });
  assert.equal(uidOnly.viewDir('vm2'), null);
  const plain = await uidOnly.enter(
    uidOnly.allocate(),
    { memoryBytes: 1, pids: 1, cpuWeight: 100 },
    '/s/vms/vm2',
  );
  assert.equal(plain[0], 'setpriv');
});

test('a jail hides no folder that holds what QEMU opens', async () => {
  const { hiddenPaths } = await import('../../src/vm/host/vm-jail.js');
  assert.deepEqual(
    hiddenPaths(
      ['/home', '/root', '/tmp', '/var/tmp', '/run', '/srv', '/'],
      ['/dev/shm/hostd-0', '/var/tmp/hostd-data', '/var/cache/hostd', '/usr/bin', '/srv2/x'],
    ),
    // /var/tmp holds the data directory; /srv2 is not under /srv; / is never a candidate.
    ['/home', '/root', '/tmp', '/run', '/srv'],
  );
});

test("a VM's view is one mount table: covers outer first, binds from descriptors, covers read-only, then hidden folders; fields escaped as fstab wants", async () => {
  const { viewTable } = await import('../../src/vm/host/vm-jail.js');
  const cover = 'mode=0711,size=64k,nosuid,nodev,noexec';
  assert.equal(
    viewTable(['/s/vms', '/data dir'], ['/s/vms/vm1', '/data dir/views/vm1'], ['/tmp']),
    `hostd-jail /s/vms tmpfs ${cover},X-mount.mkdir 0 0\n` +
      `hostd-jail /data\\040dir tmpfs ${cover},X-mount.mkdir 0 0\n` +
      '/proc/self/fd/3 /s/vms/vm1 none bind,X-mount.mkdir 0 0\n' +
      '/proc/self/fd/4 /data\\040dir/views/vm1 none bind,X-mount.mkdir 0 0\n' +
      `hostd-jail-ro /s/vms tmpfs remount,ro,${cover} 0 0\n` +
      `hostd-jail-ro /data\\040dir tmpfs remount,ro,${cover} 0 0\n` +
      'hostd-jail /tmp tmpfs ro,mode=0555,size=4k,nosuid,nodev,noexec 0 0\n',
  );
});
