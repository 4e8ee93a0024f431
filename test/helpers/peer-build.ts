/**
 * A build of `python` as another node exports it for a copy (vm/image/build-copies.ts): small
 * files of known bytes, their manifest, and the export naming them. The tests of build copies
 * fetch from it: what room they ask for (build-copies.test.ts) and what they sync
 * (build-durable.test.ts).
 */
import { createHash } from 'node:crypto';
import type { ExportedBuild } from '../../src/vm/machine.js';

export const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

/** The build's files other than its manifest: a 1000-byte root filesystem and small others. */
const FILES: Record<string, Buffer> = {
  vmlinux: Buffer.alloc(100, 1),
  'initrd.cpio': Buffer.alloc(50, 2),
  'rootfs.erofs': Buffer.alloc(1000, 3),
  'disk.qcow2': Buffer.alloc(30, 4),
};

/** A manifest of build `key` listing `names` (every file but the manifest by default). */
export const manifestOf = (key: string, names = Object.keys(FILES)): Buffer =>
  Buffer.from(
    JSON.stringify({
      name: 'python',
      key,
      files: Object.fromEntries(
        names.map((n) => [n, { size_bytes: FILES[n]!.length, sha256: sha(FILES[n]!) }]),
      ),
    }),
  );

/** Build `key`'s bytes by file name, its manifest included, and its export. */
export function peerBuild(key: string): { contents: Record<string, Buffer>; build: ExportedBuild } {
  const contents = { ...FILES, 'manifest.json': manifestOf(key) };
  return {
    contents,
    build: {
      template: 'python',
      key,
      files: Object.entries(contents).map(([name, body]) => ({
        path: `cache/templates/python/${key}/${name}`,
        size: body.length,
        sha256: sha(body),
      })),
    },
  };
}
