/**
 * Room for files copied from another node (cluster mode: a hand-over's move-in, a snapshot's
 * copy for a create placed here). Such a copy is refused before any file is fetched when what
 * it brings would pass SERVICE_MAX_STORAGE_MIB or leave the data directory short of its reserve
 * (SERVICE_MIN_FREE_MIB), rather than found over the cap once it is here: the node that asked
 * (a drain, a create's placement) then asks the next node. The refusal is `503
 * insufficient_resources`, as a node short of disk refuses a create: a drain and a placement
 * pass a 503 on to the next node, where a 507 would end a create's placement.
 */
import { fail, type HostdError } from '../errors.js';
import type { PausedManifest, StateManifest } from '../vm/machine.js';
import { once } from './once.js';

const MIB = 1024 * 1024;

/**
 * `507 storage_limit_reached` when `moreMib` on top of `usedBytes` would pass the storage cap
 * `limitMib` (0: none), else null: the one rule a snapshot, a pause and a copy are held to.
 */
export function storageCapRefusal(
  usedBytes: number,
  moreMib: number,
  limitMib: number,
): HostdError | null {
  if (limitMib <= 0) return null;
  const usedMib = Math.ceil(usedBytes / MIB);
  return usedMib + moreMib > limitMib
    ? fail('storageLimit', usedMib, Math.ceil(moreMib), limitMib)
    : null;
}

/**
 * Bytes a copy counts against the storage cap once it is here, at most: the paused machine's
 * own folder (or the snapshot's frozen state) and the disk layers it runs on, as a paused
 * sandbox and a snapshot are counted (`storageBytes`). A frozen state it starts from (a
 * template's boot, a fork point) is not counted here, as it is not on the source; a layer this
 * node holds already by id is counted all the same (the manifest does not say which it holds).
 */
export function copiedBytes(manifest: PausedManifest | StateManifest): number {
  const own = 'paused' in manifest ? manifest.paused.id : manifest.state.id;
  let n = 0;
  for (const part of manifest.parts) {
    const counted =
      part.kind === 'layer' ||
      (part.id === own && (part.kind === 'paused' || part.kind === 'state'));
    if (counted) for (const f of part.files) n += f.size;
  }
  return n;
}

/** What a CopyRoom reads of its node. */
export interface CopyRoomLimits {
  /** SERVICE_MAX_STORAGE_MIB; 0 for no cap. */
  readonly maxStorageMib: number;
  /** Bytes snapshots and paused sandboxes take now (SandboxManager.storageBytes). */
  usedBytes(): number;
  /** Why writing `mib` more to the data directory would leave it short, or null (admission). */
  diskShortage(mib: number): string | null;
}

export class CopyRoom {
  /** Bytes of copies being fetched now: counted as taken until each is here or given up. */
  private incoming = 0;

  constructor(private readonly limits: CopyRoomLimits) {}

  /**
   * Reserves room for the copy `manifest` describes, or throws `503 insufficient_resources`
   * naming the cap or the disk. Call the returned function once the copy is here (then counted
   * by `usedBytes`) or given up.
   */
  admit(manifest: PausedManifest | StateManifest): () => void {
    const bytes = copiedBytes(manifest);
    const needMib = bytes / MIB;
    const used = this.limits.usedBytes() + this.incoming;
    const full = storageCapRefusal(used, needMib, this.limits.maxStorageMib);
    if (full) throw fail('insufficientResources', full.message);
    const why = this.limits.diskShortage(needMib + this.incoming / MIB);
    if (why) throw fail('insufficientResources', why);
    this.incoming += bytes;
    return once(() => {
      this.incoming -= bytes;
    });
  }
}
