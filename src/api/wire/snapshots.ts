/** Snapshots on the wire (docs/api.md, Snapshots). */
import Type, { type Static } from 'typebox';
import type { SnapshotInfo } from '../../core/sandbox-manager.js';
import { nullable, pattern, ref, sameAs } from './schema.js';

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

/** A snapshot's name: printable ASCII, not starting with a space. */
const SNAPSHOT_NAME = pattern(
  '^[\\x21-\\x7e][\\x20-\\x7e]{0,127}$',
  '1 to 128 printable ASCII characters',
);

export const SnapshotRequest = Type.Object(
  {
    name: Type.Optional(
      nullable(
        Type.String({
          minLength: 1,
          maxLength: 128,
          pattern: SNAPSHOT_NAME,
          description: 'A name of yours (printable ASCII; need not be unique).',
        }),
      ),
    ),
  },
  {
    $id: 'SnapshotRequest',
    description: '`POST /v1/sandboxes/{id}/snapshot`: no body, `{}`, or a name.',
    additionalProperties: false,
  },
);
export type SnapshotRequest = Static<typeof SnapshotRequest>;
