/**
 * QEMU command lines as pure functions, so they can be golden-tested without starting QEMU.
 *
 * Every VM of a template uses the exact same machine and devices: a snapshot restores only
 * into an identical machine. The one thing that varies is how guest RAM is backed:
 * - `template`: RAM is a shared mapping of a tmpfs file (share=on), so once the VM is stopped
 *   the file is the RAM and the snapshot needs only the device state (xen-save-devices-state).
 * - `clone`: a private copy-on-write mapping (share=off) of an immutable image file, restored
 *   from that device state. Pages the clone writes are its own; the rest stay shared.
 *
 * A fork point becomes a new immutable image by copying a clone's base file and the pages the
 * clone wrote (vm/storage/page-delta.ts); its children are clones of that image.
 *
 * Disks: the template's root filesystem is virtio disk 1, read-only and the same file for every
 * VM (the host's page cache holds one copy for all); a VM's own writable disk, when it has one,
 * is virtio disk 2. The guest's /init tells them apart by serial number (guest/image/init).
 */

import {
  AGENT_PORT_NAME,
  FILES_PORT_NAME,
  NET_PORT_NAME,
  PROC_PORT_NAME,
  REPL_PORT_NAME,
} from '../channels/port-names.js';
import { DISK_SERIAL, ROOTFS_SERIAL, type GuestImage } from '../image/image.js';

export type { GuestImage } from '../image/image.js';

export type Accel = 'kvm' | 'tcg';

export interface MachineSpec {
  readonly image: GuestImage;
  readonly memoryMib: number;
  readonly vcpus: number;
  readonly accel: Accel;
  /** TCG translation buffer per VM; bounding it bounds each VM's host memory. */
  readonly tcgTbMib: number;
  /**
   * Host TSC frequency in kHz, passed to a TCG guest as `tsc_early_khz`. Under TCG the guest's
   * TSC is the host's, and the guest kernel's own calibration against the emulated PIT fails
   * when the host is loaded, after which boot stalls for good (seen at load 4 on 2 cores).
   */
  readonly tscKhz?: number;
  /**
   * The machine has the processes port (`hostd.proc`, vm/channels/proc-channel.ts). Every
   * template booted now has it; a state frozen before the port existed (a snapshot or a paused
   * sandbox of an earlier hostd) says nothing and restores into the machine it was made on,
   * whose processes API then answers that the sandbox predates it.
   */
  readonly procPort?: boolean;
  /**
   * The machine has one IO-APIC (microvm's `ioapic2=off`), and so 8 virtio-mmio transports
   * instead of the 24 that QEMU 7.2's microvm creates with ACPI on (our 3 devices use 3 of them).
   * Every QEMU of a sandbox creates, realizes and loads the state of each transport, used or
   * not (docs/architecture.md, "Fork"). Every template booted now has it; a state frozen before
   * (a snapshot or a paused sandbox of an earlier hostd) says nothing and restores into the
   * machine it was made on: a device state loads only into the machine that saved it.
   */
  readonly oneIoapic?: boolean;
}

/** The `-M` value of a machine: microvm with the devices hostd uses and no others. */
export function machineOption(spec: MachineSpec): string {
  const ioapic = spec.oneIoapic ? ',ioapic2=off' : '';
  return `microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=off,pic=off,acpi=on${ioapic},auto-kernel-cmdline=off,memory-backend=mem`;
}

/** The kernel command line for a machine: the image's, plus what the accelerator needs. */
export function kernelCmdline(spec: MachineSpec): string {
  if (spec.accel !== 'tcg' || !spec.tscKhz) return spec.image.cmdline;
  // Under TCG the guest TSC is the host's constant TSC: tell the guest its rate
  // (tsc_early_khz) and that it is reliable. Otherwise its calibration against the emulated
  // PIT fails on a loaded host and boot stalls, or its clocksource watchdog falls back to
  // jiffies, which needs a periodic tick: every idle VM then burns CPU.
  const append = spec.image.tcgCmdlineAppend ?? 'tsc_early_khz={host_tsc_khz} tsc=reliable';
  return `${spec.image.cmdline} ${append.replaceAll('{host_tsc_khz}', String(spec.tscKhz))}`;
}

export interface VmPaths {
  readonly qmpSocket: string;
  readonly agentSocket: string;
  readonly replSocket: string;
  /** The files port (vm/channels/file-channel.ts). */
  readonly filesSocket: string;
  /** The network port (vm/channels/net-channel.ts). */
  readonly netSocket: string;
  /** QEMU's end of the guest's serial console; hostd reads it into the console log. */
  readonly consoleSocket: string;
  /** The processes port (vm/channels/proc-channel.ts), when the spec has it. */
  readonly procSocket?: string;
  /**
   * This VM's writable disk (see `DiskChain`). Without one the guest keeps written files in RAM.
   * A snapshot restores only into a VM that agrees with the one saved on having a disk.
   */
  readonly writableDisk?: DiskChain;
}

/**
 * A VM's writable disk as QEMU opens it: the VM's own qcow2 overlay over read-only qcow2 layers
 * (vm/storage/disk-layer.ts). The chain is spelled out here, node by node, rather than read from the
 * files' headers: hostd makes every overlay by copying one empty qcow2 (no process to spawn),
 * so no header names a backing file, and hostd's records are the one place chains are kept.
 */
export interface DiskChain {
  /** The VM's overlay: the only file of the chain it writes. */
  readonly top: string;
  /**
   * The read-only layers under it, bottom first: the template's empty disk, then frozen layers.
   * Empty for a QEMU started before its state is known (a fork standby): its overlay has no
   * backing until hostd attaches one (`diskLayerNode`, blockdev-reopen).
   */
  readonly layers: readonly string[];
}

/** The node name of read-only layer `index` (bottom first) of a VM's disk chain. */
export const diskLayerNode = (index: number): string => `disk-l${index}`;
/** The node name of the overlay a VM starts with (later captures put new ones over it). */
export const DISK_TOP_NODE = 'disk';

/** A value inside a QEMU option list, where a comma must be doubled. */
const optValue = (s: string): string => s.replaceAll(',', ',,');

/** The block devices of a VM, root filesystem first: the guest relies on that order too. */
export function diskArgs(image: GuestImage, writableDisk: DiskChain | undefined): string[] {
  const args = [
    '-blockdev',
    `driver=file,filename=${optValue(image.rootfs)},node-name=rootfs-file,read-only=on`,
    '-blockdev',
    'driver=raw,file=rootfs-file,node-name=rootfs,read-only=on',
    '-device',
    `virtio-blk-device,drive=rootfs,serial=${ROOTFS_SERIAL}`,
  ];
  if (writableDisk) {
    const { top, layers } = writableDisk;
    layers.forEach((layer, i) => {
      const backing = i > 0 ? `,backing=${diskLayerNode(i - 1)}` : '';
      args.push(
        '-blockdev',
        `driver=qcow2,node-name=${diskLayerNode(i)},read-only=on,file.driver=file,file.filename=${optValue(layer)}${backing}`,
      );
    });
    const backing = layers.length ? `,backing=${diskLayerNode(layers.length - 1)}` : '';
    args.push(
      '-blockdev',
      `driver=file,filename=${optValue(top)},node-name=disk-file`,
      '-blockdev',
      `driver=qcow2,file=disk-file,node-name=${DISK_TOP_NODE}${backing}`,
      '-device',
      `virtio-blk-device,drive=${DISK_TOP_NODE},serial=${DISK_SERIAL}`,
    );
  }
  return args;
}

export type RamMode =
  | { readonly kind: 'template'; readonly memPath: string }
  | { readonly kind: 'clone'; readonly memPath: string };

/**
 * The translation buffer of a template's cold boot, at least: a boot runs far more distinct code
 * than a restored VM, and with a small buffer TCG flushes and retranslates it over and over
 * (a boot at 8 MiB did not finish in 3 minutes at load 12). The template VM exits once frozen,
 * so its buffer costs nothing later, and the buffer size is not part of the device state.
 */
export const TEMPLATE_BOOT_TB_MIB = 32;

/** Builds the argv (without the binary) for one QEMU process. */
export function qemuArgs(spec: MachineSpec, paths: VmPaths, ram: RamMode): string[] {
  const share = ram.kind === 'clone' ? 'off' : 'on';
  const accel =
    spec.accel === 'kvm'
      ? ['-accel', 'kvm', '-cpu', 'host']
      : [
          '-accel',
          `tcg,tb-size=${ram.kind === 'template' ? Math.max(spec.tcgTbMib, TEMPLATE_BOOT_TB_MIB) : spec.tcgTbMib}`,
          ...(spec.image.tcgCpu ? ['-cpu', spec.image.tcgCpu] : []),
        ];
  const args = [
    '-name',
    'hostd-vm,debug-threads=on',
    '-M',
    machineOption(spec),
    ...accel,
    '-m',
    `${spec.memoryMib}M`,
    '-smp',
    String(spec.vcpus),
    '-object',
    `memory-backend-file,id=mem,size=${spec.memoryMib}M,mem-path=${ram.memPath},share=${share}`,
    // A guest kernel panic (panic=-1 reboots at once) makes QEMU exit: the sandbox reports
    // an executor error instead of silently rebooting into an empty REPL.
    '-no-reboot',
    '-nodefaults',
    '-no-user-config',
    '-nographic',
    '-display',
    'none',
    '-monitor',
    'none',
    // Only a cold boot needs the kernel and initrd: a clone's RAM and CPU state come from the
    // snapshot, and loading 140 MB of boot files it never runs cost every clone ~50 ms of CPU.
    ...(ram.kind === 'template'
      ? ['-kernel', spec.image.kernel, '-initrd', spec.image.initrd, '-append', kernelCmdline(spec)]
      : []),
    // Disks are part of the machine: a clone has them too (its device state refers to them).
    ...diskArgs(spec.image, paths.writableDisk),
    // hostd writes the console log itself (vm/qemu/console-log.ts), so that it never passes its
    // cap; without hostd connected, QEMU drops the output.
    '-chardev',
    `socket,id=console,path=${paths.consoleSocket},server=on,wait=off`,
    '-serial',
    'chardev:console',
    '-device',
    // Port 0 is reserved for a console; ours are 1 (the agent), 2 (the Python REPL, which
    // answers Python execs itself), 3 (files), 4 (the guest's network) and 5 (processes, on
    // machines that have it): guest/PROTOCOL.md.
    `virtio-serial-device,max_ports=${spec.procPort ? 6 : 5}`,
    '-chardev',
    `socket,id=agent,path=${paths.agentSocket},server=on,wait=off`,
    '-device',
    `virtserialport,chardev=agent,name=${AGENT_PORT_NAME}`,
    '-chardev',
    `socket,id=repl,path=${paths.replSocket},server=on,wait=off`,
    '-device',
    `virtserialport,chardev=repl,name=${REPL_PORT_NAME}`,
    '-chardev',
    `socket,id=files,path=${paths.filesSocket},server=on,wait=off`,
    '-device',
    `virtserialport,chardev=files,name=${FILES_PORT_NAME}`,
    '-chardev',
    `socket,id=net,path=${paths.netSocket},server=on,wait=off`,
    '-device',
    `virtserialport,chardev=net,name=${NET_PORT_NAME}`,
    ...(spec.procPort && paths.procSocket
      ? [
          '-chardev',
          `socket,id=proc,path=${paths.procSocket},server=on,wait=off`,
          '-device',
          `virtserialport,chardev=proc,name=${PROC_PORT_NAME}`,
        ]
      : []),
    '-qmp',
    `unix:${paths.qmpSocket},server=on,wait=off`,
    // Device-state snapshots (xen-save-devices-state) carry no configuration section; every
    // VM agrees not to send or expect one so that all snapshots load the same way.
    '-global',
    'migration.send-configuration=off',
    // QEMU's own seccomp filter: no spawning, no privilege changes, no obsolete syscalls.
    '-sandbox',
    'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
  ];
  if (ram.kind !== 'template') args.push('-incoming', 'defer');
  return args;
}
