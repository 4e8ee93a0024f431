"""Behaviour of the files port (guest/PROTOCOL.md, "Files port"), driven through its framing by
a minimal host (files_host.py) against files_server.py running in a thread.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import errno
import io
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import unittest
import unittest.mock

from files_host import Done, FilesHost, files_ops, files_server
from port_frames import DATA, END, HEADER, JSON, MAX_PAYLOAD, SYNC, frame


class FilesTestCase(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="hostd-files-test-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.host = FilesHost()
        self.addCleanup(lambda: self.host.close())
        self.host.hello()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def assertFails(self, code, fn, *args, **kwargs):
        with self.assertRaises(Done) as ctx:
            fn(*args, **kwargs)
        self.assertEqual(ctx.exception.code, code, ctx.exception.msg)
        return ctx.exception.msg

    def leftovers(self, directory=None):
        """Everything under the test directory (temporary files would show up here)."""
        found = []
        for root, dirs, files in os.walk(directory or self.dir):
            found += [os.path.relpath(os.path.join(root, n), self.dir) for n in dirs + files]
        return sorted(found)


class Hello(FilesTestCase):
    def test_hello_is_answered_with_its_nonce_and_the_protocol_version(self):
        msg = self.host.hello("abc")
        self.assertEqual((msg["op"], msg["nonce"], msg["version"]), ("hello", "abc", 1))


class WriteAndRead(FilesTestCase):
    def test_a_written_file_reads_back_with_its_size_first(self):
        content = os.urandom(200_000)
        done = self.host.write(self.path("f.bin"), content)
        self.assertEqual((done["path"], done["size"]), (self.path("f.bin"), len(content)))
        head, data = self.host.read(self.path("f.bin"))
        self.assertEqual(head["size"], len(content))
        self.assertEqual(data, content)

    def test_a_small_file_is_one_frame_burst_each_way(self):
        self.host.write(self.path("small"), b"x" * 4096)
        op_id = self.host.start("read", path=self.path("small"))
        # head, data and done arrive in the guest's one write
        self.host._fill(5.0)
        kinds = []
        while self.host.buf:
            kinds.append(self.host.recv(0.01)[0])
        self.assertEqual(kinds, [JSON, DATA, JSON], op_id)

    def test_parents_are_created_mode_is_applied_and_an_existing_file_is_replaced(self):
        target = self.path("a", "b", "c.txt")
        self.host.write(target, b"old")
        self.host.write(target, b"new", mode=0o600)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"new")
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("a", "b")).st_mode), 0o755)

    def test_the_default_mode_is_0644_and_an_empty_upload_makes_an_empty_file(self):
        done = self.host.write(self.path("empty"), b"")
        self.assertEqual(done["size"], 0)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("empty")).st_mode), 0o644)

    def test_uploading_onto_a_directory_or_under_a_file_fails(self):
        os.mkdir(self.path("d"))
        self.assertFails("is_a_directory", self.host.write, self.path("d"), b"x")
        self.host.write(self.path("file"), b"x")
        self.assertFails("not_a_directory", self.host.write, self.path("file", "sub"), b"x")
        self.assertEqual(self.leftovers(), ["d", "file"])

    def test_a_refused_upload_ignores_the_data_already_sent(self):
        os.mkdir(self.path("d"))
        op_id = self.host.start("write", path=self.path("d"))
        for _ in range(20):
            self.host.send(DATA, op_id, b"z" * 30000)
        self.host.send(END, op_id)
        self.assertEqual(self.host.done(op_id)[2]["code"], "is_a_directory")
        self.assertEqual(self.host.write(self.path("next"), b"ok")["size"], 2)

    def test_reading_errors(self):
        os.mkdir(self.path("d"))
        self.assertFails("file_not_found", self.host.read, self.path("nope"))
        self.assertFails("is_a_directory", self.host.read, self.path("d"))
        self.host.write(self.path("f"), b"x")
        self.assertFails("not_a_directory", self.host.read, self.path("f", "x"))

    def test_a_fifo_or_a_device_is_refused_instead_of_blocking(self):
        os.mkfifo(self.path("fifo"))
        self.assertFails("invalid_path", self.host.read, self.path("fifo"))
        self.assertFails("invalid_path", self.host.read, "/dev/zero")

    def test_a_file_that_claims_size_zero_is_read_whole(self):
        head, data = self.host.read("/proc/self/status")
        self.assertGreater(head["size"], 0)
        self.assertEqual(len(data), head["size"])
        self.assertIn(b"Pid:", data)

    def test_the_kernel_refusing_a_file_is_the_clients_error_with_a_reason(self):
        # /proc/self/mem at offset 0: EIO, on a pseudo filesystem: about the file, not the disk
        done = self.failure(self.host.start("read", path="/proc/self/mem"))
        self.assertEqual((done["code"], done["reason"]), ("unsupported_file", "io"))
        os.mkfifo(self.path("fifo"))
        done = self.failure(self.host.start("read", path=self.path("fifo")))
        self.assertEqual((done["code"], done["reason"]), ("invalid_path", "not_regular_file"))
        done = self.failure(self.host.start("stat", path="/a/../b"))
        self.assertEqual((done["code"], done["reason"]), ("invalid_path", "dot_dot"))
        done = self.failure(self.host.start("stat", path="/" + "n" * 300))
        self.assertEqual((done["code"], done["reason"]), ("invalid_path", "name_too_long"))

    def failure(self, op_id):
        done = self.host.done(op_id)[2]
        self.assertFalse(done["ok"], done)
        return done

    def test_every_errno_is_mapped_on_purpose(self):
        expect = {
            errno.ENOENT: ("file_not_found", None), errno.EACCES: ("permission_denied", "access"),
            errno.EPERM: ("permission_denied", "not_permitted"),
            errno.EROFS: ("permission_denied", "read_only"),
            errno.ETXTBSY: ("permission_denied", "running_program"),
            errno.ENOSPC: ("sandbox_disk_full", None), errno.EFBIG: ("file_too_large", None),
            errno.ELOOP: ("invalid_path", "symlink_loop"),
            errno.EINVAL: ("unsupported_file", "invalid"),
            errno.ENXIO: ("unsupported_file", "no_device"),
            errno.EAGAIN: ("unsupported_file", "would_block"),
            errno.EBUSY: ("unsupported_file", "busy"),
            # an errno nobody expects on a path is hostd's failure, not the client's
            errno.ENOMEM: ("io_error", None),
        }
        for number, (code, reason) in expect.items():
            err = files_ops.os_error(OSError(number, os.strerror(number)), "/proc/self/mem")
            self.assertEqual((err.code, err.reason), (code, reason), errno.errorcode[number])

    def test_an_io_error_is_the_files_when_on_a_pseudo_filesystem_else_the_disks(self):
        eio = OSError(errno.EIO, os.strerror(errno.EIO))
        self.assertEqual(files_ops.filesystem_of("/proc/self/mem"), "proc")
        self.assertEqual(files_ops.os_error(eio, "/proc/self/mem").code, "unsupported_file")
        self.assertEqual(files_ops.os_error(eio, "/sys/kernel/nothing/here").code,
                         "unsupported_file", "the nearest existing parent tells")
        self.assertNotIn(files_ops.filesystem_of(self.dir), files_ops.PSEUDO_FILESYSTEMS)
        self.assertEqual(files_ops.os_error(eio, self.path("f")).code, "io_error")

    @unittest.skipUnless(os.path.exists("/sys/kernel/uevent_seqnum"), "needs sysfs")
    def test_a_sys_file_is_read_whole_whatever_size_it_claims(self):
        # sysfs says 4096 bytes for every attribute: a download of that size would be cut
        with open("/sys/kernel/uevent_seqnum", "rb") as f:
            seqnum_len = len(f.read())
        head, data = self.host.read("/sys/kernel/uevent_seqnum")
        self.assertEqual(os.stat("/sys/kernel/uevent_seqnum").st_size, 4096)
        self.assertEqual((head["size"], len(data)), (seqnum_len, seqnum_len))

    def test_symbolic_links_are_followed_for_reading(self):
        self.host.write(self.path("real"), b"content")
        os.symlink("real", self.path("link"))
        self.assertEqual(self.host.read(self.path("link"))[1], b"content")

    def test_invalid_paths(self):
        for bad in ("relative", "", "/a/../b", "/a\0b", None, 7):
            self.assertFails("invalid_path", self.host.read, bad)
            self.assertFails("invalid_path", self.host.write, bad, b"x")

    def test_dot_components_and_repeated_slashes_are_normalised(self):
        done = self.host.write(self.dir + "//./x", b"1")
        self.assertEqual(done["path"], self.path("x"))


class Listing(FilesTestCase):
    def test_list_one_level_sorted_with_types_sizes_modes_and_link_targets(self):
        os.mkdir(self.path("sub"))
        self.host.write(self.path("b.txt"), b"12345", mode=0o640)
        self.host.write(self.path("sub", "deep"), b"")
        os.symlink("b.txt", self.path("a-link"))
        os.mkfifo(self.path("pipe"))
        entries = self.host.call("list", path=self.dir)["entries"]
        self.assertEqual([(e["name"], e["type"]) for e in entries],
                         [("a-link", "symlink"), ("b.txt", "file"), ("pipe", "other"),
                          ("sub", "dir")])
        link, b = entries[0], entries[1]
        self.assertEqual(link["target"], "b.txt")
        self.assertEqual((b["path"], b["size"], b["mode"]), (self.path("b.txt"), 5, 0o640))
        self.assertAlmostEqual(b["mtime_ms"], os.stat(self.path("b.txt")).st_mtime * 1000,
                               delta=1)
        self.assertNotIn("target", b)

    def test_listing_a_file_or_nothing_fails(self):
        self.host.write(self.path("f"), b"")
        self.assertFails("not_a_directory", self.host.call, "list", path=self.path("f"))
        self.assertFails("file_not_found", self.host.call, "list", path=self.path("none"))

    def test_stat_does_not_follow_a_symbolic_link(self):
        os.symlink("/nowhere", self.path("dangling"))
        entry = self.host.call("stat", path=self.path("dangling"))["entry"]
        self.assertEqual((entry["name"], entry["type"], entry["target"]),
                         ("dangling", "symlink", "/nowhere"))
        self.assertEqual(self.host.call("stat", path="/")["entry"]["name"], "/")


class MkdirAndRemove(FilesTestCase):
    def test_mkdir_makes_parents_and_accepts_an_existing_directory(self):
        for _ in range(2):
            self.assertEqual(self.host.call("mkdir", path=self.path("x", "y"))["path"],
                             self.path("x", "y"))
        self.assertTrue(os.path.isdir(self.path("x", "y")))

    def test_mkdir_over_a_file_fails(self):
        self.host.write(self.path("f"), b"")
        self.assertFails("not_a_directory", self.host.call, "mkdir", path=self.path("f"))
        self.assertFails("not_a_directory", self.host.call, "mkdir", path=self.path("f", "g"))

    def test_remove_a_file_a_link_and_a_directory_only_when_recursive(self):
        self.host.write(self.path("d", "f"), b"x")
        os.symlink(self.path("d"), self.path("link"))
        self.host.call("remove", path=self.path("link"))
        self.assertTrue(os.path.exists(self.path("d", "f")), "the link's target stays")
        self.assertFails("is_a_directory", self.host.call, "remove", path=self.path("d"))
        self.host.call("remove", path=self.path("d"), recursive=True)
        self.assertEqual(self.leftovers(), [])
        self.assertFails("file_not_found", self.host.call, "remove", path=self.path("d"))

    def test_the_root_is_never_removed(self):
        self.assertFails("invalid_path", self.host.call, "remove", path="/", recursive=True)


class Interruptions(FilesTestCase):
    def test_a_cancelled_upload_leaves_nothing_behind(self):
        target = self.path("new", "dir", "file")
        op_id = self.host.start("write", path=target)
        self.host.send(DATA, op_id, b"partial")
        self.host.send_json(op_id, {"op": "cancel"})
        done = self.host.done(op_id)[2]
        self.assertEqual((done["ok"], done["code"]), (False, "cancelled"))
        self.assertEqual(self.leftovers(), [], "no file, no temporary, no parent it created")

    def test_a_hello_during_an_upload_ends_it_and_leaves_nothing_behind(self):
        op_id = self.host.start("write", path=self.path("f"))
        self.host.send(DATA, op_id, b"x" * 1000)
        self.host.send(DATA, op_id, b"x" * 1000)
        self.assertEqual(self.host.hello("again")["nonce"], "again")
        self.assertEqual(self.leftovers(), [])
        self.assertEqual(self.host.write(self.path("g"), b"ok")["size"], 2)

    def test_a_restore_in_the_middle_of_a_frame_ends_the_upload_at_the_next_hello(self):
        # The host's half of a frame never comes (it was in flight when the VM was frozen)
        op_id = self.host.start("write", path=self.path("f"))
        self.host.sock.sendall(bytes([DATA]) + op_id.to_bytes(4, "big")
                               + (20000).to_bytes(4, "big") + b"half")
        self.host.hello("restored")
        self.assertEqual(self.leftovers(), [])

    def test_a_cancelled_download_stops_while_the_host_reads_nothing(self):
        big = self.path("big")
        with open(big, "wb") as f:
            f.truncate(256 << 20)
        op_id = self.host.start("read", path=big)
        kind, _, head = self.host.recv()
        self.assertEqual(head["size"], 256 << 20)
        # Not reading: the guest blocks writing, and must still see the cancel
        self.host.send_json(op_id, {"op": "cancel"})
        received = 0
        while True:
            kind, frame_id, payload = self.host.recv()
            if kind == DATA:
                received += len(payload)
                continue
            self.assertEqual((frame_id, payload["code"]), (op_id, "cancelled"))
            break
        self.assertLess(received, 64 << 20)

    def never_blocking(self, *requests):
        """Sends `requests` ((id, message) or bytes) to a files server whose writes go to
        /dev/null: they never block, as when hostd reads and drops everything (the client of a
        download left). The server must still see what hostd sends and stop. Returns the
        directory whose appearance says the requests after the first were served."""
        sock, guest = socket.socketpair()
        devnull = os.open(os.devnull, os.O_WRONLY)
        server = files_server.Server(guest.fileno(), devnull, stop_at_eof=True)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        self.addCleanup(os.close, devnull)
        self.addCleanup(guest.close)
        self.addCleanup(thread.join, 10)
        self.addCleanup(sock.close)
        marker = self.path("served")
        for request in requests + ((99, {"op": "mkdir", "path": marker}),):
            if isinstance(request, bytes):
                sock.sendall(request)
            else:
                sock.sendall(frame(JSON, request[0], json.dumps(request[1]).encode()))
        deadline = time.monotonic() + 30
        while not os.path.isdir(marker):
            self.assertLess(time.monotonic(), deadline, "the server is still on the download")
            time.sleep(0.01)

    def huge(self, *parts):
        path = self.path(*parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(1 << 40)
        return path

    def test_a_cancel_stops_a_download_whose_writes_never_block(self):
        self.never_blocking((1, {"op": "read", "path": self.huge("huge")}),
                            (1, {"op": "cancel"}))

    def test_a_cancel_stops_a_tar_whose_writes_never_block(self):
        self.huge("tree", "huge")
        self.never_blocking((1, {"op": "tar_out", "path": self.path("tree")}),
                            (1, {"op": "cancel"}))

    def test_a_hello_stops_a_download_whose_writes_never_block(self):
        self.never_blocking((1, {"op": "read", "path": self.huge("huge")}),
                            bytes(MAX_PAYLOAD + HEADER.size) + SYNC,
                            (0, {"op": "hello", "nonce": "again"}))

    def test_a_host_that_goes_away_mid_upload_leaves_nothing_behind(self):
        op_id = self.host.start("write", path=self.path("sub", "f"))
        self.host.send(DATA, op_id, b"x" * 5000)
        self.host.close()
        self.assertEqual(self.leftovers(), [])
        self.host = FilesHost()            # for the cleanup's close()


class TarStreams(FilesTestCase):
    def make_tree(self):
        self.host.write(self.path("src", "a.txt"), b"alpha", mode=0o600)
        self.host.write(self.path("src", "sub", "b.bin"), os.urandom(100_000))
        os.symlink("a.txt", self.path("src", "link"))
        os.link(self.path("src", "a.txt"), self.path("src", "sub", "hard"))

    def tar_out(self, path):
        head, data, done = self.host.done(self.host.start("tar_out", path=path))
        if not done["ok"]:
            raise Done(done)
        self.assertEqual(head["op"], "head")
        return data

    def test_tar_out_then_in_reproduces_the_tree(self):
        self.make_tree()
        data = self.tar_out(self.path("src"))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.assertEqual(tar.getnames(), ["a.txt", "link", "sub", "sub/b.bin", "sub/hard"])
        done = self.host.tar_in(self.path("dst"), data)
        self.assertEqual((done["path"], done["files"]), (self.path("dst"), 5))
        self.assertEqual(done["size"], 5 + 100_000)
        diff = subprocess.run(["diff", "-r", "--no-dereference", self.path("src"),
                               self.path("dst")], capture_output=True)
        self.assertEqual(diff.returncode, 0, diff.stdout)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("dst", "a.txt")).st_mode), 0o600)
        self.assertEqual(os.readlink(self.path("dst", "link")), "a.txt")
        self.assertEqual(os.stat(self.path("dst", "a.txt")).st_ino,
                         os.stat(self.path("dst", "sub", "hard")).st_ino)

    def test_tar_out_of_a_file_is_one_member_and_of_nothing_fails_before_the_head(self):
        self.host.write(self.path("one.txt"), b"1")
        with tarfile.open(fileobj=io.BytesIO(self.tar_out(self.path("one.txt")))) as tar:
            self.assertEqual(tar.getnames(), ["one.txt"])
        op_id = self.host.start("tar_out", path=self.path("nope"))
        head, _, done = self.host.done(op_id)
        self.assertEqual((head, done["code"]), (None, "file_not_found"))

    def test_compressed_tars_are_extracted(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            add(tar, "z.txt", b"zipped")
        self.host.tar_in(self.path("out"), buf.getvalue())
        with open(self.path("out", "z.txt"), "rb") as f:
            self.assertEqual(f.read(), b"zipped")

    def test_garbage_is_not_a_tar(self):
        self.assertFails("invalid_archive", self.host.tar_in, self.path("out"), b"no tar" * 200)

    def test_setuid_bits_are_dropped(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            add(tar, "s", b"#!", mode=0o4755)
        self.host.tar_in(self.path("out"), buf.getvalue())
        self.assertEqual(stat.S_IMODE(os.stat(self.path("out", "s")).st_mode), 0o755)


def add(tar, name, content=b"", kind=tarfile.REGTYPE, linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, linkname, mode, time.time()
    if kind == tarfile.REGTYPE:
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    else:
        tar.addfile(info)


def hostile(*members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            add(tar, *member)
    return buf.getvalue()


class HostileTars(FilesTestCase):
    """Tars that try to write outside the target directory, or make device nodes."""

    def setUp(self):
        super().setUp()
        os.mkdir(self.path("target"))
        os.mkdir(self.path("outside"))

    def refused(self, data, reason=None):
        before = os.listdir(self.path("outside"))
        msg = self.assertFails("invalid_path", self.host.tar_in, self.path("target"), data)
        self.assertEqual(os.listdir(self.path("outside")), before, "nothing written outside")
        if reason is not None:
            self.assertEqual(msg["reason"], reason)
        return msg

    def test_absolute_member_names(self):
        self.refused(hostile((self.path("outside", "x"), b"pwned")))

    def test_dot_dot_member_names(self):
        self.refused(hostile(("../outside/x", b"pwned")))
        self.refused(hostile(("a/../../outside/x", b"pwned")))

    def test_a_symbolic_link_out_of_the_target(self):
        msg = self.refused(hostile(("esc", b"", tarfile.SYMTYPE, "../outside")),
                           "symlink_leads_out")
        self.assertEqual(msg["member"], "esc")
        self.refused(hostile(("esc", b"", tarfile.SYMTYPE, self.path("outside"))),
                     "symlink_absolute")

    def test_writing_through_an_existing_link_that_leads_out(self):
        os.symlink(self.path("outside"), self.path("target", "door"))
        self.refused(hostile(("door/x", b"pwned")))

    def test_a_link_inside_then_a_member_through_it_stays_inside(self):
        data = hostile(("real/", b"", tarfile.DIRTYPE), ("alias", b"", tarfile.SYMTYPE, "real"),
                       ("alias/x", b"fine"))
        self.host.tar_in(self.path("target"), data)
        with open(self.path("target", "real", "x"), "rb") as f:
            self.assertEqual(f.read(), b"fine")

    def test_a_hard_link_to_something_outside(self):
        with open(self.path("outside", "secret"), "w") as f:
            f.write("s")
        self.refused(hostile(("h", b"", tarfile.LNKTYPE, "../outside/secret")))
        self.refused(hostile(("h", b"", tarfile.LNKTYPE, self.path("outside", "secret"))))
        self.assertEqual(os.listdir(self.path("target")), [])

    def test_device_nodes_and_fifos(self):
        for kind in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
            self.refused(hostile(("dev", b"", kind)))
        self.assertEqual(os.listdir(self.path("target")), [])

    def links_inside(self):
        """Every symbolic link under the target, and where it resolves if it leads out."""
        out = []
        for root, dirs, files in os.walk(self.path("target")):
            for name in dirs + files:
                full = os.path.join(root, name)
                real = os.path.realpath(full)
                if os.path.islink(full) and not (real == self.path("target") or
                                                  real.startswith(self.path("target") + "/")):
                    out.append((os.path.relpath(full, self.dir), real))
        return out

    def test_a_link_through_a_link_made_later_cannot_lead_out(self):
        # x -> y/.. is inside while y does not exist; y -> . then makes it the target's parent
        msg = self.refused(hostile(("x", b"", tarfile.SYMTYPE, "y/.."),
                                   ("y", b"", tarfile.SYMTYPE, ".")), "symlink_dot_dot")
        self.assertEqual(msg["member"], "x")
        self.assertEqual(self.links_inside(), [])

    def test_a_link_retargeted_later_cannot_make_another_lead_out(self):
        self.refused(hostile(("sub/", b"", tarfile.DIRTYPE),
                             ("y", b"", tarfile.SYMTYPE, "sub"),
                             ("x", b"", tarfile.SYMTYPE, "y/.."),
                             ("y", b"", tarfile.SYMTYPE, ".")), "symlink_dot_dot")
        self.assertEqual(self.links_inside(), [])

    def test_leading_dot_dots_may_climb_as_far_as_the_target_not_further(self):
        ok = hostile(("a/b/", b"", tarfile.DIRTYPE), ("c", b"c"),
                     ("a/b/up", b"", tarfile.SYMTYPE, "../../c"),
                     ("a/alias", b"", tarfile.SYMTYPE, "b"),
                     ("a/alias/up2", b"", tarfile.SYMTYPE, "../../c"))
        self.host.tar_in(self.path("target"), ok)
        for link in ("a/b/up", "a/b/up2"):
            with open(self.path("target", link), "rb") as f:
                self.assertEqual(f.read(), b"c", link)
        self.refused(hostile(("a/", b"", tarfile.DIRTYPE),
                             ("a/up", b"", tarfile.SYMTYPE, "../../target/c")),
                     "symlink_leads_out")

    def test_a_link_made_out_through_a_link_already_there_is_taken_back(self):
        # A link the sandbox made (not the tar): p -> q/.. leads to the target while q is
        # missing; the tar's x -> p/z is inside when made, until the tar's q -> . turns p
        os.symlink("q/..", self.path("target", "p"))
        msg = self.refused(hostile(("x", b"", tarfile.SYMTYPE, "p/z"),
                                   ("q", b"", tarfile.SYMTYPE, ".")), "symlink_leads_out")
        self.assertEqual(msg["member"], "x")
        self.assertFalse(os.path.lexists(self.path("target", "x")), "x was taken back")

    def test_no_order_of_these_members_leaves_a_link_out(self):
        members = [("y", b"", tarfile.SYMTYPE, "."), ("y", b"", tarfile.SYMTYPE, "sub"),
                   ("sub/", b"", tarfile.DIRTYPE), ("x", b"", tarfile.SYMTYPE, "y/.."),
                   ("w", b"", tarfile.SYMTYPE, "y/y/y/.."), ("sub/u", b"", tarfile.SYMTYPE, ".."),
                   ("sub/v", b"", tarfile.SYMTYPE, "../y"), ("z", b"", tarfile.SYMTYPE, "sub/u"),
                   ("h", b"", tarfile.LNKTYPE, "sub/u/f"), ("sub/f", b"f"),
                   ("z/g", b"through z"), ("x/escape", b"pwned")]
        rng = random.Random(27)
        for _ in range(60):
            order = members[:]
            rng.shuffle(order)
            shutil.rmtree(self.path("target"))
            os.mkdir(self.path("target"))
            try:
                self.host.tar_in(self.path("target"), hostile(*order))
            except Done:
                pass
            self.assertEqual(self.links_inside(), [], [m[0] for m in order])
            self.assertEqual(os.listdir(self.path("outside")), [], [m[0] for m in order])
            self.assertEqual(sorted(os.listdir(self.dir)), ["outside", "target"])

    def test_members_before_a_refused_one_stay_and_nothing_is_half_written(self):
        data = hostile(("good", b"ok"), ("../bad", b"pwned"))
        self.refused(data)
        self.assertEqual(self.leftovers(self.path("target")), ["target/good"])


@unittest.skipUnless(os.geteuid() == 0, "mounting a small tmpfs needs root")
class MountTable(FilesTestCase):
    """What filesystem a file is on is read from the mount table once, not per operation."""

    def setUp(self):
        super().setUp()
        if files_ops._mounts_watch is not None:
            files_ops._mounts_watch[0].close()
        files_ops._mounts_watch = None     # with the cache emptied, the table is read again
        files_ops._fs_types.clear()
        reads = []
        mounted = files_ops._mounted

        def counted():
            reads.append(1)
            return mounted()
        self.reads = reads
        patcher = unittest.mock.patch.object(files_ops, "_mounted", counted)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_a_device_no_mount_shows_is_remembered_as_unknown(self):
        # The writable layer's upper directory, where a sandbox's own files are, is such a device
        unknown = os.makedev(4095, 4095)
        files_ops.filesystem_type(os.stat(self.dir).st_dev)
        before = len(self.reads)
        for _ in range(10):
            self.assertIsNone(files_ops.filesystem_type(unknown))
            self.assertEqual(files_ops.filesystem_of("/proc/self/mem"), "proc")
        # Read again only when the table changed: other programs on this host may mount meanwhile
        self.assertLess(len(self.reads) - before, 5)

    def test_a_filesystem_mounted_later_is_seen(self):
        files_ops.filesystem_type(os.makedev(4095, 4095))
        mnt = self.path("mnt")
        os.mkdir(mnt)
        mount = ["mount", "-t", "tmpfs", "tmpfs", mnt]
        if subprocess.run(mount, stderr=subprocess.DEVNULL).returncode:
            self.skipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", mnt])
        self.assertEqual(files_ops.filesystem_of(mnt), "tmpfs")


class TemporaryFiles(FilesTestCase):
    def test_a_filesystem_that_refuses_o_tmpfile_is_asked_once(self):
        tries = []
        real_open = os.open

        def no_tmpfile(path, flags, *args, **kwargs):
            if flags & os.O_TMPFILE == os.O_TMPFILE:
                tries.append(path)
                raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)
            return real_open(path, flags, *args, **kwargs)
        self.addCleanup(files_ops._no_tmpfile.discard, os.stat(self.dir).st_dev)
        with unittest.mock.patch.object(files_ops.os, "open", no_tmpfile):
            for i in range(3):
                with files_ops.AtomicFile(self.path("f"), 0o640) as f:
                    f.write(b"v%d" % i)
                    f.commit()
        self.assertEqual(len(tries), 1)
        with open(self.path("f"), "rb") as f:
            self.assertEqual(f.read(), b"v2")
        self.assertEqual(stat.S_IMODE(os.stat(self.path("f")).st_mode), 0o640)
        self.assertEqual(os.listdir(self.dir), ["f"], "no temporary name is left")


class DiskFull(FilesTestCase):
    def setUp(self):
        super().setUp()
        self.small = self.path("small")
        os.mkdir(self.small)
        mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", self.small]
        if subprocess.run(mount).returncode:
            self.skipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", self.small])

    def test_a_full_disk_is_reported_and_nothing_is_left_half_written(self):
        self.host.write(os.path.join(self.small, "keep"), b"k")
        self.assertFails("sandbox_disk_full", self.host.write, os.path.join(self.small, "big"),
                         b"x" * (2 << 20))
        self.assertEqual(os.listdir(self.small), ["keep"])
        self.assertFails("sandbox_disk_full", self.host.tar_in, os.path.join(self.small, "t"),
                         hostile(("f", b"y" * (2 << 20))))
        self.assertEqual(sorted(os.listdir(self.small)), ["keep", "t"])
        self.assertEqual(os.listdir(os.path.join(self.small, "t")), [])


if __name__ == "__main__":
    unittest.main()


class Rehearsal(unittest.TestCase):
    """files_server.rehearse(), run at the agent's start: the path's operations served once,
    nothing left behind, and never an exception."""

    def setUp(self):
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="hostd-files-rehearsal-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def rehearse(self, target, rounds=2):
        served = []
        real = files_server.OPERATIONS.copy()

        def counting(op):
            def run(link, frame_id, msg):
                served.append((op, msg.get("path")))
                return real[op](link, frame_id, msg)
            return run
        with unittest.mock.patch.dict(files_server.OPERATIONS,
                                      {op: counting(op) for op in real}), \
                unittest.mock.patch.object(files_server, "REHEARSAL_FILE", target), \
                unittest.mock.patch.object(files_server, "log") as log:
            files_server.rehearse(rounds)
        return served, log

    def test_serves_each_operation_and_leaves_nothing(self):
        target = os.path.join(self.dir, ".rehearsal")
        served, log = self.rehearse(target)
        self.assertEqual([op for op, _ in served],
                         ["write", "read", "stat", "write", "read", "stat", "list", "remove"])
        self.assertEqual(served[-2][1], "/tmp")
        self.assertFalse(os.path.exists(target))
        self.assertEqual(os.listdir(self.dir), [])
        log.assert_not_called()

    def test_a_failure_is_logged_not_raised(self):
        target = os.path.join(self.dir, "not-a-dir", ".rehearsal")
        with open(os.path.join(self.dir, "not-a-dir"), "w"):
            pass
        served, log = self.rehearse(target)
        self.assertEqual([op for op, _ in served], ["write"])   # stops at the first failure
        log.assert_called_once()
        self.assertEqual(os.listdir(self.dir), ["not-a-dir"])

    def test_primes_the_filesystem_knowledge(self):
        with unittest.mock.patch.dict(files_ops._fs_types, clear=True), \
                unittest.mock.patch.object(files_ops, "_no_tmpfile", set()):
            files_ops.prime(self.dir)
            self.assertIn(os.stat("/").st_dev, files_ops._fs_types)

    def test_an_agent_started_again_in_the_same_boot_does_not_rehearse(self):
        mark = os.path.join(self.dir, "rehearsed")
        with unittest.mock.patch.object(files_server, "REHEARSED_MARK", mark), \
                unittest.mock.patch.object(files_server, "rehearse") as rehearse, \
                unittest.mock.patch.object(files_server, "serve_port"):
            files_server.start(lambda name: None)      # the template's boot
            self.assertEqual(rehearse.call_count, 1)
            files_server.start(lambda name: None)      # sandbox-init's restart in a sandbox
            self.assertEqual(rehearse.call_count, 1)
        self.assertTrue(os.path.exists(mark))

    def test_no_mark_means_a_rehearsal_still(self):
        mark = os.path.join(self.dir, "no-such-dir", "rehearsed")
        with unittest.mock.patch.object(files_server, "REHEARSED_MARK", mark), \
                unittest.mock.patch.object(files_server, "rehearse") as rehearse, \
                unittest.mock.patch.object(files_server, "log"):
            files_server.rehearse_once()
        rehearse.assert_called_once()

    def test_no_socket_pair_means_no_rehearsal(self):
        with unittest.mock.patch.object(files_server.socket, "socketpair",
                                        side_effect=OSError(errno.EMFILE, "too many")), \
                unittest.mock.patch.object(files_server, "log") as log:
            files_server.rehearse(1)
        log.assert_called_once()
