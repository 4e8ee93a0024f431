/**
 * Ids of sandboxes (`sbx_`) and snapshots (`snap_`): the prefix plus 32 lowercase hex from a
 * CSPRNG (128 bits), so they are unguessable and safe to use as path components once validated.
 */
import { randomBytes } from 'node:crypto';

const SANDBOX_ID = /^sbx_[0-9a-f]{32}$/;
const SNAPSHOT_ID = /^snap_[0-9a-f]{32}$/;

export function newSandboxId(): string {
  return `sbx_${randomBytes(16).toString('hex')}`;
}

export function newSnapshotId(): string {
  return `snap_${randomBytes(16).toString('hex')}`;
}

/** Validate before an id touches a map key, a log line or a path. */
export function isSandboxId(value: string): boolean {
  return SANDBOX_ID.test(value);
}

export function isSnapshotId(value: string): boolean {
  return SNAPSHOT_ID.test(value);
}
