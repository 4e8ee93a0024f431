"""File operations as a user (guest/PROTOCOL.md, "Files port", "As a user"): what E2B's envd does
with files, on the files port. A request that names a `user` gets these instead of the plain
operations of files_server.py:

  - its paths may be relative (to the user's home) or start with `~`, and `..` is resolved;
  - what it creates (files, directories, their missing parents) belongs to the user;
  - entries carry owner and group names, the permission string, and for a symbolic link the
    type, mode and resolved path of its target (detail());
  - writes happen in place (open with O_TRUNC, as envd does: a watcher sees a `write` of the
    file, not a rename onto it) and may set metadata (`user.e2b.*` extended attributes);
  - `list` walks `depth` levels; `mkdir` says whether it created anything; `remove` of a
    missing path is no error.

`move` (a rename, creating the destination's parents) exists both ways: without a user its
paths are absolute and checked as every plain operation's.
"""

import errno
import os
import shutil
import stat

import guest_users
import files_ops
from files_ops import OpError, check_path, os_error

METADATA_PREFIX = "user.e2b."


def user_of(msg):
    """The account the request names; OpError unknown_user when there is none."""
    name = msg.get("user")
    try:
        return guest_users.lookup(name)
    except guest_users.UnknownUser:
        raise OpError("unknown_user", "invalid username: '%s'" % (name,)) from None


def path_of(msg, field, user):
    """The absolute path of msg[field]: resolved for `user` (see guest_users.resolve), or
    checked as a plain operation's when there is no user."""
    path = msg.get(field)
    if user is None:
        return check_path(path)
    try:
        return guest_users.resolve(path, user.home)
    except guest_users.BadPath as e:
        raise OpError("invalid_path", "%r: %s" % (path, e)) from None


# ---- entries ------------------------------------------------------------------------------

# Go's os.FileMode.String(): one letter per type or special bit set, then rwxrwxrwx. E2B's
# `permissions` field is that string, so clients comparing it see the same text.
_GO_TYPE_LETTERS = (
    (lambda m: stat.S_ISDIR(m), "d"),
    (lambda m: stat.S_ISLNK(m), "L"),
    (lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m), "D"),
    (lambda m: stat.S_ISFIFO(m), "p"),
    (lambda m: stat.S_ISSOCK(m), "S"),
    (lambda m: bool(m & stat.S_ISUID), "u"),
    (lambda m: bool(m & stat.S_ISGID), "g"),
    (lambda m: stat.S_ISCHR(m), "c"),
    (lambda m: bool(m & stat.S_ISVTX), "t"),
)


def permissions(mode):
    letters = "".join(letter for test, letter in _GO_TYPE_LETTERS if test(mode)) or "-"
    rwx = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return letters + rwx


def _kind(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def read_metadata(path):
    """{key: value} of the `user.e2b.*` extended attributes of path (not following links)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(METADATA_PREFIX):
            try:
                value = os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                continue
            found[name[len(METADATA_PREFIX):]] = value.decode("utf-8", "replace")
    return found


def detail(path, st, names, name=None):
    """An entry with everything E2B's EntryInfo shows: the plain entry's fields, `owner` and
    `group` names, `permissions` (lstat's, as Go prints a mode), `mtime_ns`, `metadata` when
    the file has some, and for a symbolic link its `resolved` path and its target's
    `target_type` and `target_mode` (null when the link dangles)."""
    mode = st.st_mode
    entry = {"name": name if name is not None else (os.path.basename(path) or "/"),
             "path": path, "type": _kind(mode), "size": st.st_size,
             "mode": stat.S_IMODE(mode), "mtime_ms": st.st_mtime_ns // 1000000,
             "mtime_ns": str(st.st_mtime_ns), "owner": names.user(st.st_uid),
             "group": names.group(st.st_gid), "permissions": permissions(mode)}
    if stat.S_ISLNK(mode):
        try:
            entry["target"] = os.readlink(path)
        except OSError:
            entry["target"] = None
        resolved = os.path.realpath(path)
        try:
            target = os.stat(path)
            entry.update(resolved=resolved, target_type=_kind(target.st_mode),
                         target_mode=stat.S_IMODE(target.st_mode))
        except OSError:
            entry.update(resolved=path, target_type=None, target_mode=None)
    metadata = read_metadata(path)
    if metadata:
        entry["metadata"] = metadata
    return entry


def stat_detail(path, names=None):
    try:
        return detail(path, os.lstat(path), names or guest_users.Names())
    except OSError as e:
        raise os_error(e, path)


def walk(path, depth):
    """The entries below directory `path` (a symbolic link to one is followed), `depth` levels
    deep, in a pre-order walk sorted by name at each level, each with detail(). Entries that
    vanish while the walk runs are left out; links below the top are not followed."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise os_error(e, path)
    if not stat.S_ISDIR(st.st_mode):
        raise OpError("not_a_directory", "%s is not a directory" % path)
    names, entries = guest_users.Names(), []

    def visit(directory, level):
        try:
            with os.scandir(directory) as it:
                children = sorted(e.name for e in it)
        except FileNotFoundError:
            return
        except OSError as e:
            if directory == path:
                raise os_error(e, path)
            return
        for child in children:
            full = os.path.join(directory, child)
            try:
                cst = os.lstat(full)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise os_error(e, full)
            entries.append(detail(full, cst, names, child))
            if level < depth and stat.S_ISDIR(cst.st_mode):
                visit(full, level + 1)
    visit(path, 1)
    return entries


# ---- changes ------------------------------------------------------------------------------

def _chown(path, user):
    if user is not None and not user.is_root:
        try:
            os.chown(path, user.uid, user.gid, follow_symlinks=False)
        except OSError as e:
            raise os_error(e, path)


def make_dirs(path, user):
    """mkdir -p, each directory it creates (mode 0755) the user's; returns what it created."""
    return files_ops.make_dirs(path, made=lambda directory: _chown(directory, user))


def write_metadata(path, metadata):
    """Replaces the file's metadata with `metadata` ({} clears it)."""
    for key in read_metadata(path):
        try:
            os.removexattr(path, METADATA_PREFIX + key)
        except OSError:
            pass
    for key, value in metadata.items():
        try:
            os.setxattr(path, METADATA_PREFIX + key, value.encode())
        except OSError as e:
            if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise OpError("io_error", "this filesystem keeps no metadata (%s)" % path)
            raise os_error(e, path)


def check_metadata(metadata):
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "\0" not in k + v
            for k, v in metadata.items()):
        raise OpError("bad_request", "metadata must be an object of non-empty string keys and "
                                     "string values")
    return metadata


# ---- operations (files_server.py calls these with its link) -------------------------------

def op_stat(link, frame_id, msg):
    return {"entry": stat_detail(path_of(msg, "path", user_of(msg)))}


def op_list(link, frame_id, msg):
    depth = msg.get("depth", 1)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise OpError("bad_request", "depth must be an int >= 0")
    return {"entries": walk(path_of(msg, "path", user_of(msg)), max(1, depth))}


def op_mkdir(link, frame_id, msg):
    user = user_of(msg)
    path = path_of(msg, "path", user)
    created = make_dirs(path, user)
    return {"path": path, "created": bool(created), "entry": stat_detail(path)}


def op_remove(link, frame_id, msg):
    path = path_of(msg, "path", user_of(msg))
    if path == "/":
        raise OpError("invalid_path", "/ cannot be removed")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"removed": False}
    except OSError as e:
        raise os_error(e, path)
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise os_error(e, path)
    return {"removed": True}


def op_move(link, frame_id, msg):
    user = user_of(msg) if msg.get("user") is not None else None
    source, target = path_of(msg, "source", user), path_of(msg, "destination", user)
    if source == "/" or target == "/":
        raise OpError("invalid_path", "/ cannot be moved")
    try:
        os.lstat(source)
    except OSError as e:
        raise os_error(e, source)
    if source != target and (target + "/").startswith(source + "/"):
        raise OpError("invalid_path", "cannot move %s into itself" % source)
    make_dirs(os.path.dirname(target), user)
    try:
        os.rename(source, target)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise OpError("is_a_directory", "%s is a directory that is not empty" % target)
        if e.errno != errno.EXDEV:
            raise os_error(e, target)
        try:
            shutil.move(source, target)
        except OSError as e2:
            raise os_error(e2, target)
    return {"path": target, "entry": stat_detail(target)}


def op_write(link, frame_id, msg):
    """Writes in place: created (mode `mode`, default 0644) or truncated, then the user's."""
    user = user_of(msg)
    path = path_of(msg, "path", user)
    metadata = check_metadata(msg.get("metadata"))
    mode = msg.get("mode", 0o644)
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise OpError("bad_request", "mode must be an int within 0..0o7777")
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise OpError("is_a_directory", "path is a directory: %s" % path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise os_error(e, path)
    make_dirs(os.path.dirname(path), user)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    except OSError as e:
        raise os_error(e, path)
    size = 0
    try:
        if user is not None and not user.is_root:
            os.fchown(fd, user.uid, user.gid)
        while True:
            data = link.recv_data()
            if data is None:
                break
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
                size += n
    except OSError as e:
        raise os_error(e, path)
    finally:
        os.close(fd)
    write_metadata(path, metadata)
    reply = {"path": path, "size": size}
    if metadata:
        reply["metadata"] = metadata
    return reply


def resolve_read(msg):
    """The path a read as a user reads."""
    return path_of(msg, "path", user_of(msg))


USER_OPERATIONS = {"stat": op_stat, "list": op_list, "mkdir": op_mkdir, "remove": op_remove,
                   "move": op_move, "write": op_write}
