"""The tar pieces on their own: what tar_directory writes reads back the same, and extraction
of an archive from a sandbox (untrusted code) never writes outside its directory or through a
symlink, strips setuid bits, skips FIFOs, and refuses bytes that are not a tar stream."""

import io
import os
import shutil
import stat
import tarfile
import tempfile
import unittest

from _trees import awkward_tree, make_tree, read_tree

from hostd import HostdError, UnsafeArchiveError
from hostd._tar import extract_tar, tar_directory

KINDS = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}


def craft(*members):
    """A tar of ``(name, kind, data_or_linkname, mode)`` entries, as no honest tool writes them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, extra, mode in members:
            info = tarfile.TarInfo(name)
            info.type = KINDS[kind]
            info.mode = mode
            data = extra.encode() if kind == "file" else b""
            if kind in ("symlink", "hardlink"):
                info.linkname = extra
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


class TarTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="hostd-py-tar-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.n = 0

    def target(self):
        """A fresh directory to extract into, beside an ``outside.txt`` that must stay untouched."""
        self.n += 1
        parent = os.path.join(self.work, "case-%d" % self.n)
        os.mkdir(parent)
        outside = os.path.join(parent, "outside.txt")
        with open(outside, "w") as f:
            f.write("untouched\n")
        return os.path.join(parent, "dest"), outside

    def test_a_directory_written_and_read_back_is_the_same_tree(self):
        src = os.path.join(self.work, "src")
        make_tree(src, awkward_tree())
        out = os.path.join(self.work, "out")
        extract_tar(io.BytesIO(b"".join(tar_directory(src))), out)
        self.assertEqual(read_tree(out), read_tree(src))

    def test_bytes_that_are_not_a_tar_stream_are_a_hostd_error(self):
        dest, _ = self.target()
        with self.assertRaises(HostdError):
            extract_tar(io.BytesIO(b"x" * 1024), dest)

    def test_refuses_entries_that_leave_the_directory(self):
        cases = {
            "a path with ..": [("../outside.txt", "file", "pwned\n", 0o644)],
            "a nested path with ..": [("a/../../outside.txt", "file", "pwned\n", 0o644)],
            "an absolute path": [("/tmp/hostd-sdk-evil-py", "file", "pwned\n", 0o644)],
            "a file through a symlink": [("link", "symlink", "..", 0o777), ("link/outside.txt", "file", "pwned\n", 0o644)],
            "a hard link to outside": [("h", "hardlink", "../outside.txt", 0o644)],
            "a hard link through a symlink": [("link", "symlink", "../outside.txt", 0o777), ("h", "hardlink", "link", 0o644)],
        }
        for what, members in cases.items():
            with self.subTest(what):
                dest, outside = self.target()
                with self.assertRaises(UnsafeArchiveError):
                    extract_tar(io.BytesIO(craft(*members)), dest)
                with open(outside) as f:
                    self.assertEqual(f.read(), "untouched\n")
                self.assertFalse(os.path.exists("/tmp/hostd-sdk-evil-py"))

    def test_a_file_over_an_existing_symlink_replaces_the_link(self):
        dest, outside = self.target()
        extract_tar(io.BytesIO(craft(("x", "symlink", "../outside.txt", 0o777), ("x", "file", "inside\n", 0o644))), dest)
        with open(outside) as f:
            self.assertEqual(f.read(), "untouched\n")
        self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(dest, "x")).st_mode))

    def test_symlinks_are_kept_setuid_bits_go_fifos_are_skipped(self):
        dest, _ = self.target()
        extract_tar(
            io.BytesIO(craft(("abs", "symlink", "/etc/hostname", 0o777), ("suid", "file", "#!/bin/sh\n", 0o4755), ("pipe", "fifo", "", 0o644))),
            dest,
        )
        self.assertEqual(os.readlink(os.path.join(dest, "abs")), "/etc/hostname")
        self.assertEqual(stat.S_IMODE(os.lstat(os.path.join(dest, "suid")).st_mode), 0o755)
        self.assertFalse(os.path.lexists(os.path.join(dest, "pipe")))

    def test_hard_links_inside_the_directory_are_kept(self):
        dest, _ = self.target()
        files, size = extract_tar(io.BytesIO(craft(("a", "file", "same\n", 0o644), ("b", "hardlink", "a", 0o644))), dest)
        self.assertEqual((files, size), (2, 5))
        self.assertEqual(os.stat(os.path.join(dest, "a")).st_ino, os.stat(os.path.join(dest, "b")).st_ino)


if __name__ == "__main__":
    unittest.main()
