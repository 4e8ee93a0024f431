/**
 * What the guest's files server reports, in the registry's words (docs/api.md, Files: errors).
 * The guest says what failed with a code and why with a reason token (guest/PROTOCOL.md, "Files
 * port"); the message a client reads is made here from those and from what the client itself
 * sent (its path, a tar member's name). The guest's own text is for the log: it may be anything
 * a compromised guest chose to write, and a client must never mistake it for hostd's.
 */
import { fail, type HostdError } from '../errors.js';
import type { FileOpError } from '../vm/machine.js';

/** Why a path was refused, by the guest's reason token. */
const INVALID_PATH: Readonly<Record<string, string>> = {
  not_absolute: 'not an absolute path',
  nul_byte: 'it holds a NUL byte',
  dot_dot: 'it holds a .. component',
  name_too_long: 'it, or a name in it, is too long',
  symlink_loop: 'too many levels of symbolic links',
  not_regular_file: 'not a regular file (FIFOs, sockets and devices are never read)',
  root: '/ cannot be removed',
};

/** Why a tar member was refused: the phrase follows `tar member "NAME" `. */
const TAR_MEMBER: Readonly<Record<string, string>> = {
  absolute_name: 'has an absolute name',
  dot_dot_name: 'has a .. component',
  names_target: 'names the target directory but is not a directory',
  parent_leads_out: 'would be written through a symbolic link leading out of the target',
  special_file: 'is a device node or a FIFO, which are not extracted',
  symlink_absolute: 'is a symbolic link to an absolute path',
  symlink_leads_out: 'is a symbolic link leading out of the target',
  symlink_dot_dot:
    'is a symbolic link with a .. after a name, which a link made later could turn to lead out of the target',
  hardlink_leads_out: 'is a hard link to something outside the target',
  hardlink_missing: 'is a hard link to a member not extracted before it',
  hardlink_not_file: 'is a hard link to something that is not a regular file',
};

const PERMISSION: Readonly<Record<string, string>> = {
  access: 'access denied (EACCES)',
  not_permitted: 'operation not permitted (EPERM)',
  read_only: 'read-only filesystem (EROFS)',
  running_program: 'the file is a running program (ETXTBSY)',
};

const UNSUPPORTED: Readonly<Record<string, string>> = {
  io: 'its filesystem (such as /proc or /sys) answered with an I/O error (EIO)',
  invalid: 'its filesystem does not take this operation on it (EINVAL)',
  no_device: 'no device or driver serves it (ENXIO, ENODEV)',
  not_supported: 'its filesystem does not support the operation (EOPNOTSUPP)',
  would_block: 'reading it would wait for data (EAGAIN)',
  busy: 'it is busy, e.g. a mount point (EBUSY)',
  process_gone: 'the process it describes has exited (ESRCH)',
  cross_device: 'it would be linked across filesystems (EXDEV)',
  too_many_links: 'one file would have too many hard links (EMLINK)',
  not_empty: 'a directory in the way is not empty (ENOTEMPTY)',
  overflow: 'a value is too large for the operation (EOVERFLOW)',
  pseudo_file_too_large: 'read whole, as /proc and /sys files are, it holds more than 1 MiB',
  answer_too_large: 'the listing is larger than 16 MiB',
};

const NOT_A_TAR = 'not a tar stream (plain, gzip, bzip2 or xz), or cut short';

/** The member a guest answer names, quoted as JSON would (control characters escaped). */
const quoted = (member: string): string => JSON.stringify(member);

/** `path/member`, for failures about a tar member that are not refusals of the member. */
function memberPath(path: string, member: string | null): string {
  if (member === null) return path;
  const name = member.replace(/^(\.?\/)+/, '');
  return name === '' || name === '.' ? path : `${path.replace(/\/+$/, '')}/${name}`;
}

/**
 * The registry error for the guest's refusal `err` of an operation on `path` in sandbox `id`;
 * null when the guest failed in a way that is no fault of the client (`io_error`: its disk
 * failed, or a bug; `bad_request`: a bug of hostd), which the caller answers as its own failure.
 */
export function clientFileError(err: FileOpError, id: string, path: string): HostdError | null {
  const reason = err.reason ?? '';
  const where = memberPath(path, err.member);
  switch (err.code) {
    case 'file_not_found':
      return fail('fileNotFound', where);
    case 'is_a_directory':
      return fail('isADirectory', where, '');
    case 'not_a_directory':
      return fail('notADirectory', where);
    case 'invalid_path': {
      const tarPhrase = err.member !== null ? TAR_MEMBER[reason] : undefined;
      const why = tarPhrase
        ? `tar member ${quoted(err.member!)} ${tarPhrase}`
        : (INVALID_PATH[reason] ?? 'the sandbox refused it');
      return fail('invalidPath', path, why);
    }
    case 'sandbox_disk_full':
      return fail('sandboxDiskFull', id);
    case 'permission_denied':
      return fail('permissionDenied', where, PERMISSION[reason] ?? 'the sandbox refused it');
    case 'file_too_large':
      return fail('sandboxFileTooLarge', where);
    case 'unsupported_file':
      return fail(
        'unsupportedFile',
        where,
        UNSUPPORTED[reason] ?? "the sandbox's kernel refused the operation",
      );
    case 'invalid_archive':
      return fail('invalidArchive', path, NOT_A_TAR);
    default:
      return null;
  }
}
