/**
 * Ids of sandboxes (`sbx_`) and snapshots (`snap_`): the prefix plus 32 lowercase hex from a
 * CSPRNG (128 bits), so they are unguessable and safe to use as path components once validated.
 */
import { randomFillSync } from 'node:crypto';

const SANDBOX_ID = /^sbx_[0-9a-f]{32}$/;
const SNAPSHOT_ID = /^snap_[0-9a-f]{32}$/;

const ID_BYTES = 16;
/**
 * CSPRNG bytes for the next 64 ids, filled at once: `randomBytes(16)` took 65 to 85 µs of
 * hostd's loop when called once every 100 ms or more (a pool hit's create, ~1.5 ms in all), its
 * job and buffer set up each time, where `randomFillSync` of this 1 KiB took 6 µs; Node's
 * `randomUUID` keeps such a cache too. Each byte is handed out once.
 */
const entropy = Buffer.alloc(ID_BYTES * 64);
let used = entropy.length;

/** 128 fresh random bits as 32 lowercase hex digits. */
export function random128Hex(): string {
  if (used === entropy.length) {
    randomFillSync(entropy);
    used = 0;
  }
  const hex = entropy.toString('hex', used, used + ID_BYTES);
  used += ID_BYTES;
  return hex;
}

export function newSandboxId(): string {
  return `sbx_${random128Hex()}`;
}

export function newSnapshotId(): string {
  return `snap_${random128Hex()}`;
}

/** Validate before an id touches a map key, a log line or a path. */
export function isSandboxId(value: string): boolean {
  return SANDBOX_ID.test(value);
}

export function isSnapshotId(value: string): boolean {
  return SNAPSHOT_ID.test(value);
}
