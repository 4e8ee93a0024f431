/**
 * Admission: whether the host can take `n` more VMs now. Two limits, each with its own answer:
 * the configured cap on sandboxes alive (429, retry later) and the host's free memory and
 * data-directory space (503): an out-of-memory host kills processes at random (hostd itself or
 * another sandbox) and a full disk makes a fork's image copy fail midway, so failing early gives
 * the client a clear error instead (core/host-resources.ts).
 */
import { fail, type HostdError } from '../errors.js';
import { diskShortage, shortage, type HostFree } from './host-resources.js';
import { once } from './once.js';

/**
 * Host memory the default sandbox cap leaves free (docs/api.md, Limits: hosts are sized with 2 GiB left): room
 * for hostd, the page cache of the images, and sandboxes that grow past their idle size.
 */
export const CAP_RESERVE_MIB = 2048;

/**
 * The default cap on sandboxes alive, when SERVICE_MAX_SANDBOXES is not set: as many idle
 * sandboxes as fit in the host's memory less the reserve, at the measured cost of one (at least
 * one sandbox, so a small host still serves). Sandboxes that grow past their idle size are
 * stopped by the memory check of `admit` (503), not by this count (429).
 *
 * @example sandboxCapFor(24105, 24) // 919 on a 24 GiB host at 24 MiB per sandbox
 */
export function sandboxCapFor(
  memTotalMib: number,
  perVmMib: number,
  reserveMib = CAP_RESERVE_MIB,
): number {
  return Math.max(1, Math.floor((memTotalMib - reserveMib) / perVmMib));
}

/**
 * Host memory (MiB) of an idle sandbox that has run code, outside any translation buffer, as the
 * bench measures it once KSM has merged what sandboxes have alike (docs/architecture.md, "Density:
 * what one sandbox costs the host": ~11 MiB with KSM over all of QEMU, 100 alive), with room for a guest
 * that wrote more. A sandbox that grows past it is held back by the memory check, not the count.
 */
export const IDLE_SANDBOX_MIB = 12;

/**
 * The part of TCG's translation buffer (MiB) an idle VM has filled, whatever the buffer's size
 * (docs/architecture.md, "Density: what one sandbox costs the host").
 */
export const IDLE_TCG_TB_MIB = 12;

/**
 * The estimated host memory of one idle sandbox: the admission's per-VM cost and the unit of the
 * default cap. `tcgTbMib` is the translation buffer's size under TCG, null under KVM (none).
 */
export function idleSandboxMib(tcgTbMib: number | null): number {
  return IDLE_SANDBOX_MIB + (tcgTbMib === null ? 0 : Math.min(tcgTbMib, IDLE_TCG_TB_MIB));
}

/** How many sandboxes this host takes, and what one is assumed to cost. */
export interface SandboxSizing {
  readonly maxSandboxes: number;
  readonly perVmMib: number;
  /** Whether the cap follows host memory (SERVICE_MAX_SANDBOXES unset or `auto`). */
  readonly fromHostMemory: boolean;
}

/**
 * The sizing hostd starts with: the configured cap (`configuredMax`, null for none) or else
 * `sandboxCapFor` the host's memory, at the cost of an idle sandbox under this accelerator.
 */
export function sandboxSizing(opts: {
  readonly configuredMax: number | null;
  readonly memTotalMib: number;
  readonly tcgTbMib: number | null;
}): SandboxSizing {
  const perVmMib = idleSandboxMib(opts.tcgTbMib);
  return {
    perVmMib,
    maxSandboxes: opts.configuredMax ?? sandboxCapFor(opts.memTotalMib, perVmMib),
    fromHostMemory: opts.configuredMax === null,
  };
}

export interface AdmissionLimits {
  /** Sandboxes alive at once, fork children and pending starts included. */
  readonly maxSandboxes: number;
  /** MiB of memory and data-dir space that must stay free after a start. */
  readonly reserveMib: number;
  /** Estimated host memory of one idle VM. */
  readonly perVmMib: number;
}

export class Admission {
  /** VMs being started (creates and forks in flight): they count against the cap already. */
  private pending = 0;

  constructor(
    private readonly limits: AdmissionLimits,
    /** Reads the host's free memory and space now. */
    private readonly hostFree: () => HostFree,
    /** Sandboxes alive now. */
    private readonly alive: () => number,
  ) {}

  /**
   * Reserves room for `vms` new VMs (whose start writes `imageMib` of image) or throws 429 /
   * 503. The caller calls the returned function once those VMs are sandboxes or gone.
   */
  admit(vms: number, imageMib = 0): () => void {
    const refused = this.refusal(vms, imageMib);
    if (refused) throw refused;
    this.pending += vms;
    return once(() => {
      this.pending -= vms;
    });
  }

  /** Whether `admit(vms)` would refuse now (the cap reached, or the host short of memory). */
  wouldRefuse(vms: number): boolean {
    return this.refusal(vms) !== null;
  }

  /** Why `vms` new VMs would be refused now (429 at the cap, 503 short of memory), or null. */
  private refusal(vms: number, imageMib = 0): HostdError | null {
    const alive = this.alive() + this.pending;
    if (alive + vms > this.limits.maxSandboxes) {
      return fail('sandboxLimit', alive, vms, this.limits.maxSandboxes);
    }
    const why = this.shortage(vms, imageMib);
    return why ? fail('insufficientResources', why) : null;
  }

  /**
   * Why the host could not afford `vms` more VMs and `imageMib` of image now, or null. Work
   * done ahead (pool refills, fork standby) asks this and waits instead of failing.
   */
  shortage(vms: number, imageMib = 0): string | null {
    return shortage(this.hostFree(), {
      vms,
      perVmMib: this.limits.perVmMib,
      imageMib,
      reserveMib: this.limits.reserveMib,
    });
  }

  /**
   * Why writing `mib` to the data directory now would leave it short of the reserve, or null:
   * files copied from another node (cluster mode), which start no VM and take no memory.
   */
  diskShortage(mib: number): string | null {
    return diskShortage(this.hostFree(), mib, this.limits.reserveMib);
  }
}
