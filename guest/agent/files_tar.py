"""Tar streams of the files port: a directory (or file) out as a tar, and a tar extracted into a
directory, both in tarfile's stream modes, so nothing is ever held whole.

The guest's Python is 3.11.2, older than tarfile's extraction filters (3.11.4), so extraction
makes its own checks, those of the "data" filter: no absolute member names, no `..`, nothing
written through a symbolic link that leads out of the target directory, no link pointing out
of it, no device nodes or FIFOs; permission bits only (no setuid, setgid, sticky), owned by
root. Stricter than that filter, no link can be made to lead out by members that come after
it (see Extraction._symlink). Each file appears complete or not at all (files_ops.AtomicFile). A failure stops the
extraction: members extracted before it stay, nothing half-written does.
"""

import os
import stat
import tarfile

from files_ops import AtomicFile, OpError, make_dirs, os_error, replace_with

CHUNK = 64 << 10


class _Padded:
    """A file's content cut or padded with zeros to the size its tar header announced: a file
    that shrinks while it is archived must not tear the stream (tarfile would raise midway)."""

    def __init__(self, f, size):
        self.f, self.left = f, size

    def read(self, n):
        n = min(n, self.left)
        data = self.f.read(n) if n else b""
        if len(data) < n:
            data += bytes(n - len(data))
        self.left -= n
        return data


def _walk(top):
    """(path, name in the archive) of everything under directory `top`, parents before their
    children, sorted by name; symbolic links are archived as links, never followed."""
    stack = [(top, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        except FileNotFoundError:
            continue                      # removed while being archived
        except OSError as e:
            raise os_error(e, directory)
        subdirs = []
        for name, is_dir in entries:
            full, arc = os.path.join(directory, name), prefix + name
            yield full, arc
            if is_dir:
                subdirs.append((full, arc + "/"))
        stack.extend(reversed(subdirs))


def _add(tar, full, arc):
    try:
        info = tar.gettarinfo(full, arc)
        if info is None:
            return                        # a socket: tar has no such member
        if not info.isreg():
            tar.addfile(info)
            return
        with open(full, "rb") as f:
            tar.addfile(info, _Padded(f, info.size))
    except FileNotFoundError:
        return                            # removed while being archived
    except OSError as e:
        raise os_error(e, full)


def write_tar(path, out):
    """Writes directory or file `path` to binary file object `out` as a tar stream, names
    relative to `path` (a file is one member named after it)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise os_error(e, path)
    with tarfile.open(fileobj=out, mode="w|", bufsize=CHUNK, format=tarfile.PAX_FORMAT) as tar:
        if not stat.S_ISDIR(st.st_mode):
            tar.dereference = True        # `path` itself may be a link to the file
            _add(tar, path, os.path.basename(path))
            return
        for full, arc in _walk(path):
            _add(tar, full, arc)


def _inside(root, path):
    return path == root or path.startswith(root.rstrip("/") + "/")


class Extraction:
    """Extracts members one by one into directory `dest` (created if missing)."""

    def __init__(self, dest):
        self.created = make_dirs(dest)
        self.root = os.path.realpath(dest)
        self.files = 0                    # members extracted, directories included
        self.size = 0                     # bytes of regular files
        self.dirs = []                    # (real path, mode, mtime), applied at the end
        self.links = []                   # (real path, member name) of the links made

    def target(self, member, name):
        """Where archive name `name` (of `member`) goes; None for the archive's root."""
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/"):
            raise _refused(member, "absolute_name", "absolute path")
        if ".." in parts:
            raise _refused(member, "dot_dot_name", "path with a .. component")
        return os.path.join(self.root, *parts) if parts else None

    def extract(self, tar, member):
        target = self.target(member, member.name)
        if target is None:
            if member.isdir():
                return
            raise _refused(member, "names_target",
                           "not a directory, yet names the target directory")
        parent = os.path.dirname(target)
        if not _inside(self.root, os.path.realpath(parent)):
            raise _refused(member, "parent_leads_out",
                           "its directory is a symbolic link leading out of %s" % self.root)
        make_dirs(parent)
        try:
            if member.isdir():
                self._dir(target, member)
            elif member.isreg():
                self._file(tar, target, member)
            elif member.issym():
                self._symlink(target, member)
            elif member.islnk():
                self._hardlink(target, member)
            else:
                raise _refused(member, "special_file",
                               "device nodes and FIFOs are not extracted")
        except OSError as e:
            err = os_error(e, target)
            err.member = member.name
            raise err
        self.files += 1

    def _dir(self, target, member):
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            os.mkdir(target, 0o700)
        else:
            if not stat.S_ISDIR(st.st_mode):
                raise OpError("not_a_directory", "tar member %r: %s exists and is not a "
                              "directory" % (member.name, target), member=member.name)
        # Its real path now: the links on the way to it may lead elsewhere at the end
        self.dirs.append((os.path.realpath(target), member.mode & 0o777, member.mtime))

    def _file(self, tar, target, member):
        src = tar.extractfile(member)
        with AtomicFile(target, member.mode & 0o777, make_parents=False) as out:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
            out.commit(member.mtime)
        self.size += out.size

    def _symlink(self, target, member):
        """Where a symbolic link leads depends on the links it passes through, which later
        members may make or replace: checking where it leads now (realpath) is not enough
        (`x -> y/..` is inside until a later `y -> .` makes it the target's parent). So a
        link's own target may only climb with leading `..`s, no higher than the target, then
        go down by names: each name is a directory of the target or a link that, by the
        same rule, leads inside, whatever the order of the members. A `..` after a name
        could climb from wherever that name leads: refused."""
        link = member.linkname
        if os.path.isabs(link):
            raise _refused(member, "symlink_absolute", "symbolic link to an absolute path")
        parts = [p for p in link.split("/") if p not in ("", ".")]
        ups = 0
        while ups < len(parts) and parts[ups] == "..":
            ups += 1
        if ".." in parts[ups:]:
            raise _refused(member, "symlink_dot_dot",
                           "symbolic link with a .. after a name, which another link can "
                           "turn to lead out of %s" % self.root)
        base = os.path.realpath(os.path.dirname(target))    # where the link really is
        depth = 0 if base == self.root else os.path.relpath(base, self.root).count("/") + 1
        if ups > depth or not _inside(self.root, os.path.realpath(os.path.join(base, link))):
            raise _refused(member, "symlink_leads_out",
                           "symbolic link leading out of %s" % self.root)
        made = os.path.join(base, os.path.basename(target))
        replace_with(made, lambda tmp: os.symlink(link, tmp))
        self.links.append((made, member.name))

    def _hardlink(self, target, member):
        source = self.target(member, member.linkname)
        if source is None or not _inside(self.root, os.path.realpath(source)):
            raise _refused(member, "hardlink_leads_out",
                           "hard link to something outside %s" % self.root)
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            raise _refused(member, "hardlink_missing",
                           "hard link to a member not extracted before it")
        if not stat.S_ISREG(st.st_mode):
            raise _refused(member, "hardlink_not_file",
                           "hard link to something that is not a regular file")
        replace_with(target, lambda tmp: os.link(source, tmp, follow_symlinks=False))

    def finish(self):
        """Takes back every link it made that leads out of the target now, and returns the
        first one's refusal (None if none does). None can by its own members
        (_symlink); one can through a link that was in the target before: `p -> q/..`,
        made in the sandbox, leads out once the tar makes `q -> .`.
        Then directory modes and times: writing into a directory changes its mtime."""
        refusal = None
        for path, name in self.links:
            if os.path.islink(path) and not _inside(self.root, os.path.realpath(path)):
                try:
                    os.unlink(path)
                except OSError:
                    pass
                self.files -= 1
                if refusal is None:
                    refusal = OpError(
                        "invalid_path", "tar member %r: symbolic link leading out of %s "
                        "through a link that was there before" % (name, self.root),
                        "symlink_leads_out", name)
        for path, mode, mtime in reversed(self.dirs):
            try:
                os.chmod(path, mode)
                os.utime(path, (mtime, mtime), follow_symlinks=False)
            except OSError:
                pass
        return refusal


def _refused(member, reason, why):
    return OpError("invalid_path", "tar member %r: %s" % (member.name, why), reason,
                   member.name)


def extract_tar(dest, src):
    """Extracts the tar stream read from binary file object `src` into directory `dest`
    (any compression tarfile knows). Returns (members extracted, bytes of files)."""
    extraction = Extraction(dest)
    try:
        with tarfile.open(fileobj=src, mode="r|*", bufsize=CHUNK) as tar:
            for member in tar:
                extraction.extract(tar, member)
    except (tarfile.TarError, EOFError) as e:
        raise OpError("invalid_archive", "not a valid tar stream: %s" % e)
    finally:
        refusal = extraction.finish()
    if refusal is not None:
        raise refusal
    return extraction.files, extraction.size
