"""Watching a directory for changes with inotify (through ctypes: the standard library has no
binding), for the `watch` stream of the processes port (guest/PROTOCOL.md, "Processes port").

Events are named as E2B's envd names them (it uses Go's fsnotify): create, rename, chmod,
write, remove, one per inotify bit, in that order, and each carries the path of the entry
relative to the watched directory. A recursive watch also watches every directory below it,
including those created (or moved in) later.
"""

import ctypes
import errno
import os
import struct

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

MASK = (IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_MODIFY | IN_ATTRIB | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF)
# (bits, event type), in the order fsnotify reports an op with several bits
KINDS = ((IN_CREATE | IN_MOVED_TO, "create"), (IN_MOVED_FROM | IN_MOVE_SELF, "rename"),
         (IN_ATTRIB, "chmod"), (IN_MODIFY, "write"), (IN_DELETE | IN_DELETE_SELF, "remove"))
EVENT = struct.Struct("iIII")    # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_SIZE = 64 << 10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)


class WatchError(Exception):
    """A directory that cannot be watched: `code` is file_not_found, not_a_directory,
    permission_denied or io_error (guest/PROTOCOL.md)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def _os_error(path):
    err = ctypes.get_errno()
    code = {errno.ENOENT: "file_not_found", errno.ENOTDIR: "not_a_directory",
            errno.EACCES: "permission_denied", errno.EPERM: "permission_denied"}.get(
                err, "io_error")
    if err == errno.ENOSPC:
        return WatchError("io_error", "%s: too many inotify watches" % path)
    return WatchError(code, "%s: %s" % (path, os.strerror(err)))


class DirWatch:
    """One watched directory. `fd` becomes readable when events wait; read_events() takes
    them. Close it with close()."""

    def __init__(self, path, recursive):
        self.root, self.recursive = path, recursive
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise _os_error(path)
        self.dirs = {}               # wd -> path relative to the root ("" for the root)
        try:
            self._add("", IN_ONLYDIR)
            if recursive:
                self._add_tree("")
        except BaseException:
            os.close(self.fd)
            raise

    def _add(self, rel, extra=0):
        full = os.path.join(self.root, rel) if rel else self.root
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(full), MASK | IN_DONT_FOLLOW | extra)
        if wd < 0:
            raise _os_error(full)
        self.dirs[wd] = rel

    def _add_tree(self, rel):
        """Watches the directories below `rel` (not following symbolic links); those that
        vanish meanwhile are skipped."""
        top = os.path.join(self.root, rel) if rel else self.root
        for dirpath, dirnames, _ in os.walk(top):
            for name in dirnames:
                sub = os.path.relpath(os.path.join(dirpath, name), self.root)
                try:
                    self._add(sub, IN_ONLYDIR)
                except WatchError:
                    pass

    def read_events(self):
        """The events that wait, as [(name relative to the root, type)], in order."""
        try:
            data = os.read(self.fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return []
        events, off = [], 0
        while off + EVENT.size <= len(data):
            wd, mask, _cookie, length = EVENT.unpack_from(data, off)
            raw = data[off + EVENT.size:off + EVENT.size + length].split(b"\0", 1)[0]
            off += EVENT.size + length
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            base = self.dirs.get(wd)
            if base is None or mask & IN_Q_OVERFLOW:
                continue
            name = os.fsdecode(raw)
            if not name:
                # The watched directory itself (removed or moved): a nested one is reported
                # by its parent; the root's own fate has no name to report
                continue
            rel = os.path.join(base, name) if base else name
            for bits, kind in KINDS:
                if mask & bits:
                    events.append((rel, kind))
            if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                try:
                    self._add(rel, IN_ONLYDIR)
                    self._add_tree(rel)
                except WatchError:
                    pass
        return events

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
