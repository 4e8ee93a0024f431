/**
 * Chooses KVM or TCG. KVM is what a real host should use; TCG is the fallback that always
 * works. These development machines expose a nested paravirtual KVM (`kvm_pvm`) that cannot run
 * a stock Debian kernel (QEMU stops with a KVM emulation failure), so its presence forces TCG.
 * The reason is logged at start.
 */
import { accessSync, constants, existsSync, readFileSync } from 'node:fs';
import type { Accel } from './qemu-args.js';

export interface AccelDecision {
  readonly accel: Accel;
  readonly reason: string;
}

/** Probe points, injectable so the decision table is unit-tested without a host. */
export interface AccelProbe {
  kvmUsable(): boolean;
  pvmLoaded(): boolean;
}

export const hostProbe: AccelProbe = {
  kvmUsable: () => {
    try {
      accessSync('/dev/kvm', constants.R_OK | constants.W_OK);
      return true;
    } catch {
      // Expected: no /dev/kvm, or no right to it: TCG.
      return false;
    }
  },
  pvmLoaded: () => existsSync('/sys/module/kvm_pvm'),
};

/** `choice` comes from SERVICE_ACCEL; `auto` inspects the host. */
export function chooseAccel(choice: 'auto' | Accel, probe: AccelProbe = hostProbe): AccelDecision {
  if (choice === 'kvm') return { accel: 'kvm', reason: 'SERVICE_ACCEL=kvm' };
  if (choice === 'tcg') return { accel: 'tcg', reason: 'SERVICE_ACCEL=tcg' };
  if (!probe.kvmUsable()) return { accel: 'tcg', reason: '/dev/kvm is missing or not accessible' };
  if (probe.pvmLoaded()) {
    return {
      accel: 'tcg',
      reason: 'kvm_pvm (nested paravirtual KVM) is loaded; it cannot run a stock guest kernel',
    };
  }
  return { accel: 'kvm', reason: '/dev/kvm is usable' };
}

/** The host TSC rate in kHz from /proc/cpuinfo ("cpu MHz"), or undefined if unknown. */
export function hostTscKhz(cpuinfo = safeRead('/proc/cpuinfo')): number | undefined {
  const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(cpuinfo);
  return m ? Math.round(Number(m[1]) * 1000) : undefined;
}

function safeRead(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    // Expected where /proc/cpuinfo is hidden: the TSC rate is then unknown.
    return '';
  }
}
