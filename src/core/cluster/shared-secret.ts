/**
 * Secrets every node of a cluster shares, kept in the coordination store (core/cluster/kv.ts)
 * under `secrets/<name>`, off any lease: E2B's per-sandbox tokens are HMACs under one
 * (api/e2b/auth.ts), so that a token issued by one node opens the sandbox on whichever node it
 * is moved to. The first node to ask makes it, with a "create if absent" compare-and-set, and
 * every other node reads that one. Values are never logged: errors name the key, not its value.
 * The catalog (catalog-view.ts) ignores these keys.
 */
import { randomBytes } from 'node:crypto';
import type { ClusterKv } from './kv.js';

/** The bytes of a shared secret: as many as a node's own E2B token secret. */
export const SHARED_SECRET_BYTES = 32;

/** The key of shared secret `name`, relative to the store's prefix. */
export function sharedSecretKey(name: string): string {
  return `secrets/${name}`;
}

/**
 * Shared secret `name`: the one in the store, or a fresh one put there when it has none. Rejects
 * when the store is unreachable, or when the key holds something that is not such a secret (it is
 * then left alone: an operator's value is not overwritten).
 */
export async function sharedSecret(kv: ClusterKv, name: string): Promise<Buffer> {
  const key = sharedSecretKey(name);
  // Two tries: a node that loses the race to make it reads the winner's.
  for (let attempt = 0; attempt < 2; attempt++) {
    const entry = await kv.get(key);
    if (entry) return decode(key, entry.value);
    const made = randomBytes(SHARED_SECRET_BYTES);
    const value = JSON.stringify({ secret: made.toString('base64') });
    const res = await kv.txn([{ key, modRevision: 0 }], [{ put: key, value }]);
    if (res.succeeded) return made;
  }
  throw new Error(`the cluster's ${key} changed while it was read; retrying`);
}

function decode(key: string, value: string): Buffer {
  let secret: unknown;
  try {
    secret = (JSON.parse(value) as { secret?: unknown }).secret;
  } catch {
    secret = undefined;
  }
  const bytes = typeof secret === 'string' ? Buffer.from(secret, 'base64') : null;
  if (!bytes || bytes.length < SHARED_SECRET_BYTES) {
    throw new Error(`the cluster's ${key} is not a secret of ${SHARED_SECRET_BYTES} bytes`);
  }
  return bytes;
}
