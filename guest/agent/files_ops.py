"""Filesystem operations of the files port (guest/PROTOCOL.md, "Files port"), without the port:
path checks, the error codes hostd maps to its HTTP errors, files that appear only when
complete, listings. files_server.py drives them; files_tar.py builds on them.
"""

import ctypes
import errno
import os
import secrets
import select
import shutil
import stat

PSEUDO_FILE_MAX = 1 << 20   # a file claiming size 0 (/proc, /sys) is read whole up to this
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


class OpError(Exception):
    """An operation failed in a way hostd reports to its client: `code` is one of
    file_not_found, is_a_directory, not_a_directory, invalid_path, sandbox_disk_full,
    permission_denied, file_too_large, unsupported_file, invalid_archive, bad_request,
    io_error. `reason` (one of REASONS, or None) says why in a word hostd turns into its own
    message; `member` names a tar member. `message` is for logs: hostd never shows it to its
    client (guest/PROTOCOL.md, "Files port")."""

    def __init__(self, code, message, reason=None, member=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.member = member

    def fields(self):
        """The failure's fields of a `done`."""
        done = {"code": self.code, "message": self.message}
        if self.reason is not None:
            done["reason"] = self.reason
        if self.member is not None:
            done["member"] = self.member
        return done


# errno -> (code, reason). Every errno a path operation can meet is here on purpose; anything
# else is io_error, which hostd answers as its own failure (500) and logs.
_ERRNO_CODES = {
    errno.ENOENT: ("file_not_found", None),
    errno.EISDIR: ("is_a_directory", None),
    errno.ENOTDIR: ("not_a_directory", None),
    errno.ENAMETOOLONG: ("invalid_path", "name_too_long"),
    errno.ELOOP: ("invalid_path", "symlink_loop"),
    errno.ENOSPC: ("sandbox_disk_full", None),
    errno.EDQUOT: ("sandbox_disk_full", None),
    errno.EFBIG: ("file_too_large", None),
    errno.EACCES: ("permission_denied", "access"),
    errno.EPERM: ("permission_denied", "not_permitted"),
    errno.EROFS: ("permission_denied", "read_only"),
    errno.ETXTBSY: ("permission_denied", "running_program"),
    # The file's kind or filesystem does not serve this operation: /proc/self/mem (EIO, on a
    # pseudo filesystem only, see below), a write-only /sys attribute (EINVAL), a socket or a
    # device without its driver (ENXIO, ENODEV), /proc/kmsg read without blocking (EAGAIN), a
    # mount point (EBUSY), a process that exited while it was read (ESRCH).
    errno.EIO: ("unsupported_file", "io"),
    errno.EINVAL: ("unsupported_file", "invalid"),
    errno.ENXIO: ("unsupported_file", "no_device"),
    errno.ENODEV: ("unsupported_file", "no_device"),
    errno.EOPNOTSUPP: ("unsupported_file", "not_supported"),
    errno.EAGAIN: ("unsupported_file", "would_block"),
    errno.EBUSY: ("unsupported_file", "busy"),
    errno.ESRCH: ("unsupported_file", "process_gone"),
    errno.EXDEV: ("unsupported_file", "cross_device"),
    errno.EMLINK: ("unsupported_file", "too_many_links"),
    errno.ENOTEMPTY: ("unsupported_file", "not_empty"),
    errno.EOVERFLOW: ("unsupported_file", "overflow"),
}

# Filesystems whose files are the kernel's interfaces, not stored data: an I/O error there
# is about the file asked for. Anywhere else it is the sandbox's disk failing.
PSEUDO_FILESYSTEMS = frozenset((
    "proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup",
    "cgroup2", "configfs", "bpf", "pstore", "efivarfs", "mqueue", "hugetlbfs", "binfmt_misc",
    "fusectl", "autofs", "rpc_pipefs", "nsfs", "selinuxfs"))


# st_dev -> filesystem type, or None for a device no mount shows (the writable layer's upper
# directory, which holds every file the sandbox wrote: the overlay root shows only `overlay`).
# Valid until the mount table changes; before, every read of a written file missed and read
# mountinfo again: 2 to 9 ms of each small download under TCG.
_fs_types = {}
_mounts_watch = None    # (file, poll) of an open mountinfo: POLLPRI once the table changed


def _mount_table_unchanged():
    """Whether the mount table is as it was when _fs_types was filled: the kernel flags an open
    /proc/self/mountinfo with POLLPRI (and POLLERR) after every mount or unmount. False the
    first time, and whenever it cannot tell; the caller then reads the table again."""
    global _mounts_watch
    if _mounts_watch is not None:
        try:
            if not _mounts_watch[1].poll(0):
                return True
        except OSError:
            pass
        _mounts_watch[0].close()
        _mounts_watch = None
    try:
        watched = open("/proc/self/mountinfo", "rb", buffering=0)
    except OSError:
        return False
    poller = select.poll()
    poller.register(watched.fileno(), select.POLLPRI)
    _mounts_watch = (watched, poller)   # opened before the table is read: no change is missed
    return False


def _mounted():
    types = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if "-" not in fields[6:]:
                    continue
                at = fields.index("-", 6)
                major, _, minor = fields[2].partition(":")
                if at + 1 < len(fields) and major.isdigit() and minor.isdigit():
                    types[os.makedev(int(major), int(minor))] = fields[at + 1]
    except OSError:
        pass
    return types


def filesystem_type(st_dev):
    """The type of the mounted filesystem of device st_dev (`proc`, `overlay`...); None if
    unknown."""
    if not _mount_table_unchanged():
        _fs_types.clear()
        _fs_types.update(_mounted())
    return _fs_types.setdefault(st_dev, None)


def is_pseudo(st):
    return filesystem_type(st.st_dev) in PSEUDO_FILESYSTEMS


def filesystem_of(path):
    """The type of the filesystem `path` (or its nearest existing parent) is on; None if
    unknown."""
    while True:
        try:
            return filesystem_type(os.stat(path).st_dev)
        except OSError:
            if path in ("/", ""):
                return None
            path = os.path.dirname(path)


def os_error(e, path):
    """The OpError for an OSError met while working on `path`."""
    code, reason = _ERRNO_CODES.get(e.errno, ("io_error", None))
    if e.errno == errno.EIO and filesystem_of(path) not in PSEUDO_FILESYSTEMS:
        code, reason = "io_error", None
    return OpError(code, "%s: %s" % (path, e.strerror or e), reason)


def check_path(path):
    """The normalised form of an absolute guest path; OpError invalid_path for anything else
    (hostd checks too: this end trusts nothing)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise OpError("invalid_path", "%r is not an absolute path" % (path,), "not_absolute")
    if "\0" in path:
        raise OpError("invalid_path", "the path holds a NUL byte", "nul_byte")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OpError("invalid_path", "%r holds a .. component" % path, "dot_dot")
    return "/" + "/".join(parts)


def make_dirs(path, made=None):
    """Creates directory `path` and its missing parents (mode 0755); returns the directories it
    created, outermost first, so that a failed operation can take them back. `made(directory)`,
    if given, is called on each as it is created (files_user.py gives them to the user)."""
    return _make_dirs(path, made)[0]


def _make_dirs(path, made=None):
    """make_dirs, and the device of the filesystem `path` is on (its nearest existing
    ancestor's: the directories it creates are on the same one)."""
    missing = []
    probe = path
    while True:
        try:
            st = os.stat(probe)
        except FileNotFoundError:
            missing.append(probe)
            probe = os.path.dirname(probe)
            continue
        except OSError as e:
            raise os_error(e, probe)
        if not stat.S_ISDIR(st.st_mode):
            raise OpError("not_a_directory", "%s is not a directory" % probe)
        break
    device = st.st_dev
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            if not os.path.isdir(directory):    # made by someone else meanwhile
                raise OpError("not_a_directory", "%s is not a directory" % directory)
            continue
        except OSError as e:
            remove_dirs(created)
            raise os_error(e, directory)
        if made is not None:
            made(directory)
        created.append(directory)
    return created, device


def remove_dirs(created):
    """Takes back directories make_dirs created (innermost first), those still empty."""
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            pass


def temp_name(target):
    directory, name = os.path.split(target)
    return os.path.join(directory, ".%s.hostd-%s" % (name[:64], secrets.token_hex(6)))


def replace_with(target, make):
    """Creates an entry with make(tmp) under a temporary name, then renames it onto target, so
    that target is either what it was or the new entry, never half of it."""
    tmp = temp_name(target)
    try:
        make(tmp)
        os.rename(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# Devices whose filesystem refused O_TMPFILE (overlayfs before Linux 6.6: the sandbox's own
# root): AtomicFile goes straight to a temporary name there. The refused open cost ~1.3 ms of
# every small upload under TCG. A device number reused by another filesystem only gets the
# fallback, which is always correct.
_no_tmpfile = set()


class AtomicFile:
    """A regular file that appears at `path` only when complete (commit()): its bytes go to an
    unnamed file in the same directory (O_TMPFILE), which gets a name only at the end, so an
    upload interrupted in any way, even by the death of this process, leaves nothing behind.
    Filesystems without O_TMPFILE get a hidden temporary name instead, removed on failure.
    Use it as a context manager: leaving without commit() discards everything, including
    the parent directories it created."""

    def __init__(self, path, mode, make_parents=True):
        self.path, self.mode = path, mode
        self.size = 0
        self.fd = None
        self.tmp = None              # the temporary name, when the file has one
        self.committed = False
        parent = os.path.dirname(path)
        self.created, device = _make_dirs(parent) if make_parents else ([], None)
        try:
            self._open(parent, device)
        except BaseException:
            remove_dirs(self.created)
            raise

    def _open(self, parent, device):
        try:
            st = os.lstat(self.path)
            if stat.S_ISDIR(st.st_mode):
                raise OpError("is_a_directory", "%s is a directory" % self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise os_error(e, self.path)
        if device not in _no_tmpfile:
            try:
                self.fd = os.open(parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
                return
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise os_error(e, self.path)
                if device is not None:
                    _no_tmpfile.add(device)
        self.tmp = temp_name(self.path)
        try:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                              0o600)
        except OSError as e:
            self.tmp = None
            raise os_error(e, self.path)

    def write(self, data):
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
                self.size += n
        except OSError as e:
            raise os_error(e, self.path)

    def commit(self, mtime=None):
        try:
            os.fchmod(self.fd, self.mode)
            if mtime is not None:
                os.utime(self.fd, (mtime, mtime))
            if self.tmp is None:
                # A name for the unnamed file, then the rename: link() cannot replace
                replace_with(self.path, lambda tmp: link_fd(self.fd, tmp))
            else:
                os.rename(self.tmp, self.path)
                self.tmp = None
        except OSError as e:
            raise os_error(e, self.path)
        self.committed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        if not self.committed:
            if self.tmp is not None:
                try:
                    os.unlink(self.tmp)
                except OSError:
                    pass
            remove_dirs(self.created)
        return False


def prime(directory="/tmp"):
    """Does once, at the agent's start, what every sandbox's first file operations would
    otherwise each do again: read the mount table (the first download's is_pseudo) and learn
    whether `directory`'s filesystem refuses O_TMPFILE (the first upload's failed open). The
    template is frozen after the agent started, so every sandbox restored from it starts with
    both known, and under TCG its QEMU never translates those one-off paths (docs/architecture.md,
    "Where a small file operation ..."). Both stay correct: a mount or unmount invalidates the
    table (_mount_table_unchanged), and a device that refused O_TMPFILE only gets the named
    temporary file, which is always correct. Best effort: anything failing here is learnt at
    first use, as before."""
    try:
        filesystem_type(os.stat("/").st_dev)
        device = os.stat(directory).st_dev
    except OSError:
        return
    if device in _no_tmpfile:
        return
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            _no_tmpfile.add(device)
        return
    os.close(fd)                 # unnamed: nothing is left of it


def link_fd(fd, path):
    """Gives the file open on fd (an O_TMPFILE) the name `path`: linkat(AT_EMPTY_PATH), which
    needs CAP_DAC_READ_SEARCH (the agent is root), else through /proc/self/fd (which some
    kernels refuse with EXDEV)."""
    if _libc.linkat(fd, b"", AT_FDCWD, os.fsencode(path), AT_EMPTY_PATH) == 0:
        return
    os.link("/proc/self/fd/%d" % fd, path)


def entry(path, st, name=None):
    """The API's description of one directory entry (docs/api.md, "Files")."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    result = {"name": name if name is not None else (os.path.basename(path) or "/"),
              "path": path, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(mode),
              "mtime_ms": st.st_mtime_ns // 1000000}
    if kind == "symlink":
        try:
            result["target"] = os.readlink(path)
        except OSError:
            result["target"] = None
    return result


def stat_path(path):
    try:
        return entry(path, os.lstat(path))
    except OSError as e:
        raise os_error(e, path)


def list_dir(path):
    """The entries of directory `path`, one level, sorted by name. Entries that vanish while
    being listed are left out."""
    try:
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
    except OSError as e:
        raise os_error(e, path)
    entries = []
    for name in names:
        full = os.path.join(path, name)
        try:
            entries.append(entry(full, os.lstat(full), name))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise os_error(e, full)
    return entries


def mkdir(path):
    """mkdir -p: no error if it exists as a directory."""
    make_dirs(path)


def remove(path, recursive):
    if path == "/":
        raise OpError("invalid_path", "/ cannot be removed", "root")
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
        elif not recursive:
            raise OpError("is_a_directory", "%s is a directory" % path)
        else:
            shutil.rmtree(path)     # never follows symbolic links
    except OSError as e:
        raise os_error(e, path)


def open_for_read(path):
    """An fd on regular file `path` (symbolic links followed) and its size. Anything else is
    refused before a byte is read: a FIFO or a device could block or never end. A file that
    claims size 0, or is on a pseudo filesystem (/proc, /sys: their sizes are 0 or a page
    whatever they hold, or, for /proc/kcore, 128 TiB), is read whole, up to PSEUDO_FILE_MAX:
    then the size is its content's, which comes back as the third value (else None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise os_error(e, path)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OpError("is_a_directory", "%s is a directory" % path)
        if not stat.S_ISREG(st.st_mode):
            raise OpError("invalid_path", "%s is not a regular file" % path, "not_regular_file")
        if st.st_size > 0 and not is_pseudo(st):
            return fd, st.st_size, None
        content = bytearray()
        while len(content) <= PSEUDO_FILE_MAX:
            piece = os.read(fd, 65536)
            if not piece:
                return fd, len(content), bytes(content)
            content += piece
        raise OpError("unsupported_file", "%s claims size 0 but holds more than %d bytes"
                      % (path, PSEUDO_FILE_MAX), "pseudo_file_too_large")
    except OSError as e:
        os.close(fd)
        raise os_error(e, path)
    except BaseException:
        os.close(fd)
        raise
