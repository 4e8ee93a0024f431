/** Snapshots on the wire (docs/api.md, Snapshots). */
import Type, { type Static } from 'typebox';
import type { SnapshotInfo } from '../../core/sandbox-manager.js';
import { nullable, ref, sameAs } from './schema.js';

export const Snapshot = Type.Object(
  {
    snapshot_id: Type.String({ examples: ['snap_0123456789abcdef0123456789abcdef'] }),
    source_sandbox_id: Type.String({
      description: 'The sandbox it was taken from (it may be gone).',
    }),
    template: Type.String(),
    size_bytes: Type.Integer({ minimum: 0, description: 'Disk space it takes.' }),
    created_at: Type.String({ format: 'date-time' }),
    sandboxes: Type.Integer({
      minimum: 0,
      description: 'Sandboxes created from it that still exist.',
    }),
    name: nullable(
      Type.String({ description: 'The name it was given at snapshot, if any (not unique).' }),
    ),
  },
  {
    $id: 'Snapshot',
    description: "A snapshot: a sandbox's whole state kept on disk.",
    additionalProperties: false,
  },
);
export type Snapshot = Static<typeof Snapshot>;
sameAs<Snapshot, SnapshotInfo>(true);

export const SnapshotList = Type.Object(
  { snapshots: Type.Array(ref(Snapshot)) },
  { $id: 'SnapshotList', additionalProperties: false },
);
