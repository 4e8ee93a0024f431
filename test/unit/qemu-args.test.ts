import { test } from 'node:test';
import assert from 'node:assert/strict';
import { qemuArgs, type MachineSpec } from '../../src/vm/qemu/qemu-args.js';
import { chooseAccel, hostTscKhz } from '../../src/vm/qemu/accel.js';

const spec: MachineSpec = {
  image: {
    kernel: '/img/vmlinux',
    initrd: '/img/initrd.cpio',
    rootfs: '/img/rootfs.erofs',
    cmdline: 'console=ttyS0 quiet',
    key: 'k',
  },
  memoryMib: 512,
  vcpus: 1,
  accel: 'tcg',
  tcgTbMib: 32,
};
const paths = {
  qmpSocket: '/s/qmp.sock',
  agentSocket: '/s/agent.sock',
  replSocket: '/s/repl.sock',
  filesSocket: '/s/files.sock',
  netSocket: '/s/net.sock',
  consoleSocket: '/s/console.sock',
};

const argAfter = (args: string[], flag: string): string[] =>
  args.flatMap((a, i) => (a === flag ? [args[i + 1]!] : []));

test('a template boots with its RAM as a shared file and no -incoming', () => {
  const args = qemuArgs(spec, paths, { kind: 'template', memPath: '/s/t.mem' });
  assert.ok(
    argAfter(args, '-object').includes(
      'memory-backend-file,id=mem,size=512M,mem-path=/s/t.mem,share=on',
    ),
  );
  assert.ok(!args.includes('-incoming'));
});

test('a clone maps the image privately (copy-on-write) and waits for an incoming migration', () => {
  const args = qemuArgs(spec, paths, { kind: 'clone', memPath: '/s/t.mem' });
  assert.ok(
    argAfter(args, '-object').includes(
      'memory-backend-file,id=mem,size=512M,mem-path=/s/t.mem,share=off',
    ),
  );
  assert.deepEqual(argAfter(args, '-incoming'), ['defer']);
});

test('template and clone differ only in share=, -incoming and the boot files (snapshots need identical machines)', () => {
  const t = qemuArgs(spec, paths, { kind: 'template', memPath: '/m' });
  const c = qemuArgs(spec, paths, { kind: 'clone', memPath: '/m' });
  const boot = new Set(['-kernel', '-initrd', '-append', '-incoming']);
  const strip = (a: string[]): string[] =>
    a
      .map((x) => x.replace('share=on', 'share=X').replace('share=off', 'share=X'))
      .filter((x, i, all) => !boot.has(x) && !boot.has(all[i - 1]!));
  assert.deepEqual(strip(c), strip(t));
  assert.ok(!c.includes('-kernel') && !c.includes('-initrd'), 'a clone loads no boot files');
});

test('the root filesystem is the first virtio disk, read-only, found by the guest by its serial', () => {
  const args = qemuArgs(spec, paths, { kind: 'template', memPath: '/m' });
  assert.deepEqual(argAfter(args, '-blockdev'), [
    'driver=file,filename=/img/rootfs.erofs,node-name=rootfs-file,read-only=on',
    'driver=raw,file=rootfs-file,node-name=rootfs,read-only=on',
  ]);
  assert.deepEqual(
    argAfter(args, '-device').filter((d) => d.startsWith('virtio-blk')),
    ['virtio-blk-device,drive=rootfs,serial=hostd-root'],
  );
});

test('a writable disk is the second virtio disk, a qcow2 the VM may write', () => {
  const args = qemuArgs(
    spec,
    { ...paths, writableDisk: { top: '/d/top.qcow2', layers: [] } },
    { kind: 'template', memPath: '/m' },
  );
  assert.deepEqual(argAfter(args, '-blockdev').slice(2), [
    'driver=file,filename=/d/top.qcow2,node-name=disk-file',
    'driver=qcow2,file=disk-file,node-name=disk',
  ]);
  assert.deepEqual(
    argAfter(args, '-device').filter((d) => d.startsWith('virtio-blk')),
    [
      'virtio-blk-device,drive=rootfs,serial=hostd-root',
      'virtio-blk-device,drive=disk,serial=hostd-disk',
    ],
  );
});

test('the writable disk is the VM overlay over read-only layers, chained bottom first', () => {
  const writableDisk = { top: '/d/top.qcow2', layers: ['/img/disk.qcow2', '/d/layer-1.qcow2'] };
  const args = qemuArgs(spec, { ...paths, writableDisk }, { kind: 'clone', memPath: '/m' });
  assert.deepEqual(argAfter(args, '-blockdev').slice(2), [
    'driver=qcow2,node-name=disk-l0,read-only=on,file.driver=file,file.filename=/img/disk.qcow2',
    'driver=qcow2,node-name=disk-l1,read-only=on,file.driver=file,file.filename=/d/layer-1.qcow2,backing=disk-l0',
    'driver=file,filename=/d/top.qcow2,node-name=disk-file',
    'driver=qcow2,file=disk-file,node-name=disk,backing=disk-l1',
  ]);
});

test('a clone has the same disks as its template: they are part of the restored machine', () => {
  const withDisk = { ...paths, writableDisk: { top: '/d/top.qcow2', layers: [] } };
  const t = qemuArgs(spec, withDisk, { kind: 'template', memPath: '/m' });
  const c = qemuArgs(spec, withDisk, { kind: 'clone', memPath: '/m' });
  assert.deepEqual(argAfter(c, '-blockdev'), argAfter(t, '-blockdev'));
});

test('commas in file names are escaped for QEMU option lists', () => {
  const image = { ...spec.image, rootfs: '/a,b/rootfs.erofs' };
  const args = qemuArgs({ ...spec, image }, paths, { kind: 'template', memPath: '/m' });
  assert.equal(
    argAfter(args, '-blockdev')[0],
    'driver=file,filename=/a,,b/rootfs.erofs,node-name=rootfs-file,read-only=on',
  );
});

test('TCG bounds the translation buffer; KVM uses the host CPU', () => {
  assert.deepEqual(argAfter(qemuArgs(spec, paths, { kind: 'template', memPath: '/m' }), '-accel'), [
    'tcg,tb-size=32',
  ]);
  const kvm = qemuArgs({ ...spec, accel: 'kvm' }, paths, { kind: 'template', memPath: '/m' });
  assert.deepEqual(argAfter(kvm, '-accel'), ['kvm']);
  assert.deepEqual(argAfter(kvm, '-cpu'), ['host']);
});

test('a small translation buffer applies to restored VMs; a cold boot keeps at least 32 MiB', () => {
  const small = { ...spec, tcgTbMib: 8 };
  const accelOf = (kind: 'template' | 'clone'): string[] =>
    argAfter(qemuArgs(small, paths, { kind, memPath: '/m' }), '-accel');
  assert.deepEqual(accelOf('clone'), ['tcg,tb-size=8']);
  assert.deepEqual(accelOf('template'), ['tcg,tb-size=32']);
});

test('the guest gets no network device and QEMU runs under its seccomp sandbox', () => {
  const args = qemuArgs(spec, paths, { kind: 'clone', memPath: '/m' });
  assert.ok(args.includes('-nodefaults'));
  assert.ok(!args.some((a) => /netdev|virtio-net|-nic/.test(a)));
  assert.match(argAfter(args, '-sandbox')[0]!, /^on,.*spawn=deny/);
});

test('accelerator: explicit choice wins; auto prefers KVM unless it is missing or nested PVM', () => {
  const probe = (kvm: boolean, pvm: boolean) => ({ kvmUsable: () => kvm, pvmLoaded: () => pvm });
  assert.equal(chooseAccel('tcg', probe(true, false)).accel, 'tcg');
  assert.equal(chooseAccel('kvm', probe(false, false)).accel, 'kvm');
  assert.equal(chooseAccel('auto', probe(true, false)).accel, 'kvm');
  assert.equal(chooseAccel('auto', probe(false, false)).accel, 'tcg');
  const pvm = chooseAccel('auto', probe(true, true));
  assert.equal(pvm.accel, 'tcg');
  assert.match(pvm.reason, /kvm_pvm/);
});

test('a TCG guest is told the host TSC rate so a loaded host cannot stall its boot', () => {
  const args = qemuArgs({ ...spec, tscKhz: 2445426 }, paths, { kind: 'template', memPath: '/m' });
  // (only a cold boot gets a command line: clones do not boot)
  assert.deepEqual(argAfter(args, '-append'), [
    'console=ttyS0 quiet tsc_early_khz=2445426 tsc=reliable',
  ]);
  const kvm = qemuArgs({ ...spec, accel: 'kvm', tscKhz: 2445426 }, paths, {
    kind: 'template',
    memPath: '/m',
  });
  assert.deepEqual(argAfter(kvm, '-append'), ['console=ttyS0 quiet']);
  assert.equal(hostTscKhz('model name: x\ncpu MHz\t\t: 2445.426\n'), 2445426);
  assert.equal(hostTscKhz(''), undefined);
});

test('the image manifest can set the TCG command-line addition and CPU model', () => {
  const image = {
    ...spec.image,
    tcgCmdlineAppend: 'tsc_early_khz={host_tsc_khz}',
    tcgCpu: 'qemu64,+rdrand',
  };
  const args = qemuArgs({ ...spec, image, tscKhz: 1000 }, paths, {
    kind: 'template',
    memPath: '/m',
  });
  assert.deepEqual(argAfter(args, '-append'), ['console=ttyS0 quiet tsc_early_khz=1000']);
  assert.deepEqual(argAfter(args, '-cpu'), ['qemu64,+rdrand']);
});

test('machines booted now have the processes port; states frozen before it keep their five ports', () => {
  const withPort = qemuArgs(
    { ...spec, procPort: true },
    { ...paths, procSocket: '/s/proc.sock' },
    { kind: 'clone', memPath: '/m' },
  );
  assert.ok(argAfter(withPort, '-device').includes('virtio-serial-device,max_ports=6'));
  assert.ok(argAfter(withPort, '-device').includes('virtserialport,chardev=proc,name=hostd.proc'));
  assert.ok(
    argAfter(withPort, '-chardev').includes('socket,id=proc,path=/s/proc.sock,server=on,wait=off'),
  );
  const before = qemuArgs(
    spec,
    { ...paths, procSocket: '/s/proc.sock' },
    { kind: 'clone', memPath: '/m' },
  );
  assert.ok(argAfter(before, '-device').includes('virtio-serial-device,max_ports=5'));
  assert.ok(!before.some((a) => a.includes('hostd.proc')));
});

test('machines booted now have one IO-APIC (8 virtio-mmio transports); states frozen before keep both', () => {
  const machine = (s: MachineSpec): string =>
    argAfter(qemuArgs(s, paths, { kind: 'clone', memPath: '/m' }), '-M')[0]!;
  assert.match(machine({ ...spec, oneIoapic: true }), /^microvm,.*,ioapic2=off,/);
  assert.doesNotMatch(machine(spec), /ioapic2/);
  // Only that option differs: a device state loads only into the machine that saved it.
  assert.equal(machine({ ...spec, oneIoapic: true }).replace(',ioapic2=off', ''), machine(spec));
});
