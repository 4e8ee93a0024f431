"""``sandbox.files`` against a fake: the exact requests of docs/api.md ("Files") for every
method, uploads of text, bytes, files and iterables (chunked, never held whole), streamed
downloads, and directories both ways as tar streams that GNU tar reads and writes."""

import io
import os
import shutil
import subprocess
import tempfile
import unittest

from _support import SANDBOX_ID, FakeHostd
from _trees import awkward_tree, make_tree, read_tree

from hostd import ConnectionException, InvalidRequestError, Sandbox, SandboxFileNotFoundError, resolve_config

FILES = "/v1/sandboxes/%s/files" % SANDBOX_ID
ENTRY = {"name": "a b.txt", "path": "/root/a b.txt", "type": "file", "size": 5, "mode": 420, "mtime_ms": 1763640000123}


class FilesTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)
        self.files = Sandbox(SANDBOX_ID, resolve_config(base_url=self.fake.url)).files
        self.work = tempfile.mkdtemp(prefix="hostd-py-files-")
        self.addCleanup(shutil.rmtree, self.work, True)

    def last(self):
        return self.fake.requests[-1]

    def test_write_sends_the_bytes_with_mode_as_an_octal_string(self):
        self.fake.handler = lambda req, res: res.json(200, {"path": "/root/a b.txt", "size": len(req.body)})
        self.assertEqual(self.files.write("/root/a b.txt", "h\u00e9llo"), {"path": "/root/a b.txt", "size": 6})
        r = self.last()
        self.assertEqual((r.method, r.path), ("PUT", FILES + "?path=%2Froot%2Fa%20b.txt"))
        self.assertEqual((r.headers["content-type"], r.headers["content-length"]), ("application/octet-stream", "6"))
        self.assertEqual(r.body, "h\u00e9llo".encode())
        self.files.write("/x", b"\x00\xff", mode=0o755)
        self.assertEqual((self.last().path, self.last().body), (FILES + "?path=%2Fx&mode=0755", b"\x00\xff"))
        self.files.write("/x", bytearray(b"\x01"), mode="0600")
        self.assertEqual(self.last().path, FILES + "?path=%2Fx&mode=0600")

    def test_write_streams_files_and_iterables_chunked(self):
        self.fake.handler = lambda req, res: res.json(200, {"path": "/s", "size": len(req.body)})
        for source in (io.BytesIO(b"one two three"), iter([b"one ", b"two ", b"three"]), (c for c in ["one ", "two three"])):
            with self.subTest(source=type(source).__name__):
                self.assertEqual(self.files.write("/s", source), {"path": "/s", "size": 13})
                self.assertEqual(self.last().body, b"one two three")
                self.assertEqual(self.last().headers.get("transfer-encoding"), "chunked")

    def test_a_failing_source_raises_its_own_error(self):
        def broken():
            yield b"start"
            raise OSError("disk on fire")

        self.fake.handler = lambda req, res: res.json(200, {"path": "/s", "size": 0})
        with self.assertRaises(OSError) as caught:
            self.files.write("/s", broken())
        self.assertNotIsInstance(caught.exception, ConnectionException)

    def test_read_returns_the_bytes_and_a_missing_file_is_sandbox_file_not_found(self):
        def handler(req, res):
            if "missing" in req.path:
                return res.error(404, "/missing does not exist", "file_not_found")
            res.raw(200, b"\x01\x02\x03", "application/octet-stream")

        self.fake.handler = handler
        self.assertEqual(self.files.read("/root/f.bin"), b"\x01\x02\x03")
        self.assertEqual((self.last().method, self.last().path), ("GET", FILES + "?path=%2Froot%2Ff.bin"))
        self.assertEqual(self.last().headers["accept"], "application/octet-stream")
        with self.assertRaises(SandboxFileNotFoundError) as caught:
            self.files.read("/missing")
        self.assertEqual(caught.exception.code, "file_not_found")

    def test_read_stream_yields_chunks_and_a_cut_body_is_connection_exception(self):
        big = bytes(range(256)) * 4096
        self.fake.handler = lambda req, res: res.raw(200, big, "application/octet-stream")
        with self.files.read_stream("/big") as stream:
            chunks = list(stream)
        self.assertEqual(b"".join(chunks), big)
        with self.files.read_stream("/big") as stream, open(os.path.join(self.work, "copy"), "wb") as out:
            shutil.copyfileobj(stream, out)
        with open(os.path.join(self.work, "copy"), "rb") as f:
            self.assertEqual(f.read(), big)

        def cut(req, res):
            res._h.send_response(200)
            res._h.send_header("content-length", "100")
            res._h.end_headers()
            res._h.wfile.write(b"x" * 10)
            res.drop()

        self.fake.handler = cut
        with self.assertRaises(ConnectionException):
            with self.files.read_stream("/cut") as stream:
                list(stream)

    def test_list_stat_mkdir_and_remove_use_the_documented_routes(self):
        def handler(req, res):
            if req.route == FILES + "/list":
                return res.json(200, {"entries": [ENTRY]})
            if req.route == FILES + "/stat":
                return res.json(200, ENTRY)
            if req.route == FILES + "/mkdir":
                return res.json(200, {"path": "/root/d"})
            if req.route == FILES + "/move":
                return res.json(200, {"path": "/root/new name"})
            if req.params.get("path") == "/root/file":
                return res.error(400, "/root/file is a directory", "is_a_directory")
            res.empty()

        self.fake.handler = handler
        start = len(self.fake.requests)
        self.assertEqual(self.files.list("/root"), [ENTRY])
        self.assertEqual(self.files.stat("/root/a b.txt"), ENTRY)
        self.assertIsNone(self.files.mkdir("/root/d"))
        self.assertEqual(self.files.move("/root/d", "/root/new name"), "/root/new name")
        self.files.remove("/root/d", recursive=True)
        self.files.remove("/root/e")
        with self.assertRaises(InvalidRequestError) as caught:
            self.files.remove("/root/file")
        self.assertEqual(caught.exception.code, "is_a_directory")
        self.assertEqual(
            [(r.method, r.path, r.body) for r in self.fake.requests[start:]],
            [
                ("GET", FILES + "/list?path=%2Froot", b""),
                ("GET", FILES + "/stat?path=%2Froot%2Fa%20b.txt", b""),
                ("POST", FILES + "/mkdir?path=%2Froot%2Fd", b""),
                ("POST", FILES + "/move?path=%2Froot%2Fd&to=%2Froot%2Fnew%20name", b""),
                ("DELETE", FILES + "?path=%2Froot%2Fd&recursive=1", b""),
                ("DELETE", FILES + "?path=%2Froot%2Fe", b""),
                ("DELETE", FILES + "?path=%2Froot%2Ffile", b""),
            ],
        )

    def test_upload_dir_sends_one_tar_stream_that_gnu_tar_unpacks_into_the_same_tree(self):
        src = os.path.join(self.work, "up-src")
        make_tree(src, awkward_tree())
        self.fake.handler = lambda req, res: res.json(200, {"path": "/root/up", "files": 6, "size": len(req.body)})
        info = self.files.upload_dir(src, "/root/up")
        r = self.last()
        self.assertEqual(info, {"path": "/root/up", "files": 6, "size": len(r.body)})
        self.assertEqual((r.method, r.path, r.headers["content-type"]), ("PUT", FILES + "?path=%2Froot%2Fup", "application/x-tar"))
        out = os.path.join(self.work, "up-out")
        os.mkdir(out)
        subprocess.run(["tar", "-x", "-C", out], input=r.body, check=True)
        self.assertEqual(read_tree(out), read_tree(src))

    def test_download_dir_unpacks_gnu_tar_formats_into_the_same_tree(self):
        for fmt in ("gnu", "pax", "ustar"):
            with self.subTest(format=fmt):
                tree = awkward_tree()
                if fmt == "ustar":
                    tree = {"a.txt": tree["a.txt"], "sub/b": tree["run.sh"]}
                src = os.path.join(self.work, "down-src-" + fmt)
                make_tree(src, tree)
                tar = subprocess.run(["tar", "-c", "--format=" + fmt, "-C", src, "."], capture_output=True, check=True).stdout
                self.fake.handler = lambda req, res, t=tar: res.raw(200, t, "application/x-tar")
                out = os.path.join(self.work, "down-out-" + fmt)
                info = self.files.download_dir("/root/data", out)
                self.assertEqual(self.last().path, FILES + "?path=%2Froot%2Fdata&format=tar")
                self.assertEqual(self.last().headers["accept"], "application/x-tar")
                self.assertEqual(read_tree(out), read_tree(src))
                files = [n for n in tree.values() if n[0] == "file"]
                self.assertEqual(info, {"path": out, "files": len(files), "size": sum(len(n[1].encode()) for n in files)})

    def test_a_download_cut_short_is_connection_exception(self):
        src = os.path.join(self.work, "cut-src")
        make_tree(src, {"big.bin": ("file", "z" * 200000, 0o644)})
        tar = subprocess.run(["tar", "-c", "-C", src, "."], capture_output=True, check=True).stdout

        def cut(req, res):
            res._h.send_response(200)
            res._h.send_header("content-length", str(len(tar)))
            res._h.end_headers()
            res._h.wfile.write(tar[:100000])
            res.drop()

        self.fake.handler = cut
        with self.assertRaises(ConnectionException):
            self.files.download_dir("/root", os.path.join(self.work, "cut-out"))


if __name__ == "__main__":
    unittest.main()
