"""File operations as a user on the files port (guest/PROTOCOL.md, "Files port", "As a user"),
driven through the port by files_host.py, and the path and name helpers behind them.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import errno
import grp
import os
import shutil
import stat
import tempfile
import unittest

from files_host import Done, FilesHost   # first: it puts the agent's directory on the path

import files_user    # noqa: E402
import guest_users   # noqa: E402

NOBODY = 65534


def xattrs_work(directory):
    probe = os.path.join(directory, ".xattr-probe")
    open(probe, "w").close()
    try:
        os.setxattr(probe, "user.probe", b"1")
        return True
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        os.unlink(probe)


class AsUser(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="hostd-files-user-"))
        os.chmod(self.dir, 0o777)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.host = FilesHost()
        self.addCleanup(self.host.close)
        self.host.hello()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def call(self, op, user="root", **fields):
        return self.host.call(op, user=user, **fields)

    def assertFails(self, code, fn, *args, **kwargs):
        with self.assertRaises(Done) as ctx:
            fn(*args, **kwargs)
        self.assertEqual(ctx.exception.code, code, ctx.exception.msg)
        return ctx.exception.msg


class Paths(unittest.TestCase):
    def test_relative_paths_tilde_and_dotdot_resolve_against_the_home(self):
        home = "/home/user"
        self.assertEqual(guest_users.resolve("a.txt", home), "/home/user/a.txt")
        self.assertEqual(guest_users.resolve("", home), "/home/user")
        self.assertEqual(guest_users.resolve("~", home), "/home/user")
        self.assertEqual(guest_users.resolve("~/x/../y", home), "/home/user/y")
        self.assertEqual(guest_users.resolve("../../../etc", home), "/etc")
        self.assertEqual(guest_users.resolve("//tmp//x/", home), "/tmp/x")

    def test_a_nul_byte_is_refused(self):
        with self.assertRaises(guest_users.BadPath):
            guest_users.resolve("a\0b", "/root")

    def test_permissions_print_as_go_prints_a_file_mode(self):
        p = files_user.permissions
        self.assertEqual(p(stat.S_IFREG | 0o644), "-rw-r--r--")
        self.assertEqual(p(stat.S_IFDIR | 0o755), "drwxr-xr-x")
        self.assertEqual(p(stat.S_IFLNK | 0o777), "Lrwxrwxrwx")
        self.assertEqual(p(stat.S_IFDIR | stat.S_ISVTX | 0o777), "dtrwxrwxrwx")
        self.assertEqual(p(stat.S_IFREG | stat.S_ISUID | 0o755), "urwxr-xr-x")
        self.assertEqual(p(stat.S_IFCHR | 0o666), "Dcrw-rw-rw-")


class Write(AsUser):
    @unittest.skipUnless(os.geteuid() == 0, "giving files to another user needs root")
    def test_a_users_file_and_the_parents_made_for_it_belong_to_the_user(self):
        done = self.host.write(self.path("a", "b", "f.txt"), b"hi", user="nobody")
        self.assertEqual((done["path"], done["size"]), (self.path("a", "b", "f.txt"), 2))
        for p in (self.path("a"), self.path("a", "b"), self.path("a", "b", "f.txt")):
            st = os.stat(p)
            self.assertEqual((st.st_uid, st.st_gid), (NOBODY, NOBODY), p)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("a", "b", "f.txt")).st_mode), 0o644)

    def test_writing_an_existing_file_rewrites_it_in_place(self):
        path = self.path("f")
        self.host.write(path, b"first, longer", user="root")
        inode = os.stat(path).st_ino
        self.host.write(path, b"second", user="root")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"second")
        self.assertEqual(os.stat(path).st_ino, inode)

    def test_a_directory_is_not_a_target(self):
        os.mkdir(self.path("d"))
        self.assertFails("is_a_directory", self.host.write, self.path("d"), b"x", user="root")

    def test_metadata_is_kept_as_extended_attributes_and_replaced_by_each_write(self):
        if not xattrs_work(self.dir):
            self.skipTest("no user extended attributes on this filesystem")
        path = self.path("m")
        done = self.host.write(path, b"x", user="root", metadata={"k": "v", "o": "p"})
        self.assertEqual(done["metadata"], {"k": "v", "o": "p"})
        self.assertEqual(self.call("stat", path=path)["entry"]["metadata"], {"k": "v", "o": "p"})
        self.host.write(path, b"y", user="root")
        self.assertNotIn("metadata", self.call("stat", path=path)["entry"])

    def test_an_unknown_user_is_refused(self):
        msg = self.assertFails("unknown_user", self.host.write, self.path("x"), b"x",
                               user="no-such-user")
        self.assertIn("invalid username", msg["message"])


class Entries(AsUser):
    @unittest.skipUnless(os.geteuid() == 0, "giving files to another user needs root")
    def test_stat_gives_owner_group_permissions_and_nanosecond_mtime(self):
        self.host.write(self.path("f"), b"abc", user="nobody")
        entry = self.call("stat", path=self.path("f"))["entry"]
        st = os.lstat(self.path("f"))
        self.assertEqual(
            {k: entry[k] for k in ("name", "type", "size", "mode", "permissions", "owner",
                                   "group", "mtime_ns")},
            {"name": "f", "type": "file", "size": 3, "mode": 0o644,
             "permissions": "-rw-r--r--", "owner": "nobody",
             "group": grp.getgrgid(NOBODY).gr_name, "mtime_ns": str(st.st_mtime_ns)})

    def test_a_symbolic_link_shows_its_targets_type_mode_and_resolved_path(self):
        os.mkdir(self.path("d"), 0o750)
        os.symlink("d", self.path("link"))
        entry = self.call("stat", path=self.path("link"))["entry"]
        self.assertEqual((entry["type"], entry["target_type"], entry["target_mode"],
                          entry["resolved"], entry["permissions"]),
                         ("symlink", "dir", 0o750, self.path("d"), "Lrwxrwxrwx"))

    def test_a_dangling_link_has_no_target_type(self):
        os.symlink("nowhere", self.path("dangling"))
        entry = self.call("stat", path=self.path("dangling"))["entry"]
        self.assertEqual((entry["target_type"], entry["resolved"]), (None, self.path("dangling")))

    def test_a_missing_path_is_not_found(self):
        self.assertFails("file_not_found", self.call, "stat", path=self.path("nope"))


class ListDepth(AsUser):
    def tree(self):
        for d in ("b", "b/b1", "b/b1/deep", "b/b2", "c"):
            os.mkdir(self.path(d))
        for f in ("a.txt", "b/x.txt", "b/b1/deep/z"):
            open(self.path(f), "w").close()

    def names(self, depth):
        entries = self.call("list", path=self.dir, depth=depth)["entries"]
        return [os.path.relpath(e["path"], self.dir) for e in entries]

    def test_depth_one_lists_the_children_sorted_by_name(self):
        self.tree()
        self.assertEqual(self.names(1), ["a.txt", "b", "c"])

    def test_deeper_listings_walk_in_pre_order_sorted_at_each_level(self):
        self.tree()
        self.assertEqual(self.names(2), ["a.txt", "b", "b/b1", "b/b2", "b/x.txt", "c"])
        self.assertEqual(self.names(5), ["a.txt", "b", "b/b1", "b/b1/deep", "b/b1/deep/z",
                                         "b/b2", "b/x.txt", "c"])

    def test_a_linked_directory_is_listed_under_the_path_asked_for(self):
        self.tree()
        os.symlink(self.path("b"), self.path("via"))
        entries = self.call("list", path=self.path("via"))["entries"]
        self.assertEqual(entries[0]["path"], self.path("via", "b1"))

    def test_a_file_is_not_a_directory_and_a_missing_path_is_not_found(self):
        open(self.path("f"), "w").close()
        self.assertFails("not_a_directory", self.call, "list", path=self.path("f"))
        self.assertFails("file_not_found", self.call, "list", path=self.path("nope"))


@unittest.skipUnless(os.geteuid() == 0, "giving files to another user needs root")
class MakeRemoveMove(AsUser):
    def test_mkdir_says_whether_it_created_the_directory(self):
        done = self.call("mkdir", user="nobody", path=self.path("x", "y"))
        self.assertTrue(done["created"])
        self.assertEqual(os.stat(self.path("x", "y")).st_uid, NOBODY)
        self.assertEqual(done["entry"]["mode"], 0o755)
        self.assertFalse(self.call("mkdir", path=self.path("x", "y"))["created"])

    def test_mkdir_over_a_file_is_not_a_directory(self):
        open(self.path("f"), "w").close()
        self.assertFails("not_a_directory", self.call, "mkdir", path=self.path("f"))

    def test_remove_is_recursive_and_a_missing_path_is_no_error(self):
        os.makedirs(self.path("d", "e"))
        open(self.path("d", "e", "f"), "w").close()
        self.assertTrue(self.call("remove", path=self.path("d"))["removed"])
        self.assertFalse(os.path.exists(self.path("d")))
        self.assertFalse(self.call("remove", path=self.path("d"))["removed"])

    def test_move_renames_creating_the_destinations_parents(self):
        self.host.write(self.path("src"), b"data", user="root")
        done = self.call("move", user="nobody", source=self.path("src"),
                         destination=self.path("new", "dst"))
        self.assertEqual((done["path"], done["entry"]["name"], done["entry"]["size"]),
                         (self.path("new", "dst"), "dst", 4))
        self.assertFalse(os.path.exists(self.path("src")))
        self.assertEqual(os.stat(self.path("new")).st_uid, NOBODY)

    def test_move_onto_a_non_empty_directory_is_refused(self):
        os.makedirs(self.path("a"))
        os.makedirs(self.path("b", "inside"))
        self.assertFails("is_a_directory", self.call, "move", source=self.path("a"),
                         destination=self.path("b"))

    def test_move_of_a_missing_source_is_not_found(self):
        self.assertFails("file_not_found", self.call, "move", source=self.path("nope"),
                         destination=self.path("x"))

    def test_a_directory_cannot_move_into_itself(self):
        os.mkdir(self.path("d"))
        self.assertFails("invalid_path", self.call, "move", source=self.path("d"),
                         destination=self.path("d", "e"))

    def test_move_without_a_user_takes_absolute_paths_only(self):
        open(self.path("a"), "w").close()
        done = self.host.call("move", source=self.path("a"), destination=self.path("b"))
        self.assertEqual(done["path"], self.path("b"))
        with self.assertRaises(Done) as ctx:
            self.host.call("move", source="b", destination="c")
        self.assertEqual(ctx.exception.code, "invalid_path")


class ReadAsUser(AsUser):
    def test_a_read_resolves_the_path_for_the_user(self):
        self.host.write(self.path("r"), b"content", user="root")
        rel = os.path.relpath(self.path("r"), os.path.expanduser("~root"))
        head, data, done = self.host.done(self.host.start("read", path=rel, user="root"))
        self.assertEqual((done["ok"], data), (True, b"content"))


if __name__ == "__main__":
    unittest.main()
