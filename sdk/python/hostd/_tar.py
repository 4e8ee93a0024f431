"""Directories as tar streams, both ways, never holding a whole file.

Writing: headers come from the standard library's ``TarInfo.tobuf`` (PAX where ustar cannot
hold a name or a size), content is yielded as it is read, so an upload streams.

Reading: ``tarfile`` in stream mode (``r|``) over the download. The sandbox runs untrusted
code, so its archive is untrusted too: nothing may land outside the directory. Entries with an
absolute path or a ``..`` component are refused, nothing is ever written through a symlink
(every parent is checked, and files are opened with O_NOFOLLOW after removing what was there),
hard links must point at a file extracted inside the directory, permissions lose their setuid,
setgid and sticky bits, and devices and FIFOs are skipped. Symlinks themselves are recreated
as they are, like ``tar`` and ``docker cp`` do: a link is harmless until something writes
through it, and this code never does. The TypeScript SDK's tar-extract.ts follows the same
rules."""

from __future__ import annotations

import os
import stat as stat_mod
import tarfile
from typing import IO, Iterator, List, Optional, Tuple

from ._errors import HostdError, UnsafeArchiveError

_BLOCK = 512
_CHUNK = 65536
_WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def _walk(root: str, prefix: str = "") -> Iterator[Tuple[str, str, os.stat_result]]:
    """``(archive name, local path, lstat)`` of everything under ``root``: depth first, parents
    before children, names sorted."""
    for name in sorted(os.listdir(os.path.join(root, prefix) if prefix else root)):
        rel = prefix + "/" + name if prefix else name
        path = os.path.join(root, *rel.split("/"))
        st = os.lstat(path)
        yield rel, path, st
        if stat_mod.S_ISDIR(st.st_mode):
            yield from _walk(root, rel)


def tar_directory(root: str) -> Iterator[bytes]:
    """The tar stream of everything under ``root`` (not ``root`` itself). Symlinks are stored as
    links, never followed; sockets, FIFOs and devices are left out. A file that changes size
    while it is read aborts the stream."""
    for rel, path, st in _walk(root):
        info = tarfile.TarInfo(rel)
        info.mode = stat_mod.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        if stat_mod.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat_mod.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(path)
        elif stat_mod.S_ISREG(st.st_mode):
            info.size = st.st_size
        else:
            continue
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.isfile():
            sent = 0
            with open(path, "rb") as f:
                while sent < info.size:
                    chunk = f.read(min(_CHUNK, info.size - sent))
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
            if sent != info.size or os.stat(path).st_size != info.size:
                raise OSError("%s changed size while it was being uploaded" % path)
            yield b"\0" * (-info.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)


def _safe_parts(name: str) -> List[str]:
    if name.startswith("/") or "\0" in name:
        raise UnsafeArchiveError("tar entry %r has an absolute path" % name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError("tar entry %r leaves its directory" % name)
    return parts


def _make_parents(root: str, parts: List[str]) -> None:
    """Creates the parents of ``parts`` under ``root``, refusing any that is a symlink or a file."""
    path = root
    for part in parts[:-1]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if not stat_mod.S_ISDIR(st.st_mode):
            kind = "symlink" if stat_mod.S_ISLNK(st.st_mode) else "file"
            raise UnsafeArchiveError("tar entry under %r would be written through a %s" % (part, kind))


def _lstat(path: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def extract_tar(source: IO[bytes], dest: str) -> Tuple[int, int]:
    """Extracts the tar stream ``source`` into ``dest`` (created if missing); returns the regular
    files written (hard links included) and their bytes. Directory permissions are applied last,
    deepest first, so that a read-only directory does not stop its own contents being written.
    On failure, what was extracted so far stays."""
    root = os.path.abspath(dest)
    os.makedirs(root, exist_ok=True)
    files = size = 0
    dir_modes: List[Tuple[str, int]] = []
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                parts = _safe_parts(member.name)
                if not parts:
                    continue  # the directory itself
                target = os.path.join(root, *parts)
                _make_parents(root, parts)
                existing = _lstat(target)
                if member.isdir():
                    if existing is not None and not stat_mod.S_ISDIR(existing.st_mode):
                        os.unlink(target)
                        existing = None
                    if existing is None:
                        os.mkdir(target, 0o700)
                    dir_modes.append((target, (member.mode & 0o777) | 0o700))
                    continue
                if not (member.isfile() or member.issym() or member.islnk()):
                    continue
                if existing is not None and stat_mod.S_ISDIR(existing.st_mode):
                    raise UnsafeArchiveError("tar entry %s would replace a directory" % member.name)
                if existing is not None:
                    os.unlink(target)
                if member.issym():
                    os.symlink(member.linkname, target)
                elif member.islnk():
                    link_parts = _safe_parts(member.linkname)
                    _make_parents(root, link_parts)
                    origin = os.path.join(root, *link_parts)
                    st = _lstat(origin)
                    if st is None or not stat_mod.S_ISREG(st.st_mode):
                        raise UnsafeArchiveError(
                            "tar entry %s links to %s, which is not a file extracted here" % (member.name, member.linkname)
                        )
                    os.link(origin, target)
                    files += 1
                else:
                    _write(tar, member, target)
                    files += 1
                    size += member.size
    except tarfile.TarError as e:
        raise HostdError("hostd sent a tar stream that could not be read: %s" % e) from e
    for path, mode in reversed(dir_modes):
        os.chmod(path, mode)
    return files, size


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str) -> None:
    content = tar.extractfile(member)
    fd = os.open(target, _WRITE_NEW, 0o600)
    with os.fdopen(fd, "wb") as out:
        if content is not None:
            while True:
                chunk = content.read(_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
    os.chmod(target, member.mode & 0o777)
    os.utime(target, (member.mtime, member.mtime))
