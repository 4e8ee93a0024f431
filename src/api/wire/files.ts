/** Files on the wire (docs/api.md, Files). */
import Type, { type Static } from 'typebox';
import type { FileEntry as CoreFileEntry } from '../../core/sandbox-manager.js';
import { nullable, stringEnum, sameAs } from './schema.js';

export const FileEntry = Type.Object(
  {
    name: Type.String(),
    path: Type.String(),
    type: stringEnum(['file', 'dir', 'symlink', 'other']),
    size: Type.Integer({ minimum: 0 }),
    mode: Type.Integer({ description: 'Permission bits, e.g. 420 for 0644.' }),
    mtime_ms: Type.Integer({ description: 'Modification time, milliseconds since the epoch.' }),
    target: Type.Optional(
      nullable(Type.String({ description: 'Symbolic links only: where it points.' })),
    ),
  },
  {
    $id: 'FileEntry',
    description: 'A file, directory, symbolic link or other entry of a sandbox.',
    additionalProperties: false,
  },
);
export type FileEntry = Static<typeof FileEntry>;
sameAs<FileEntry, CoreFileEntry>(true);

export const FileWritten = Type.Object(
  {
    path: Type.String(),
    size: Type.Integer({ minimum: 0 }),
    files: Type.Optional(
      Type.Integer({
        minimum: 0,
        description: 'Tar uploads: members extracted, directories included.',
      }),
    ),
  },
  { $id: 'FileWritten', additionalProperties: false },
);
export type FileWritten = Static<typeof FileWritten>;
