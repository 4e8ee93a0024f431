"""``sandbox.files`` against the real hostd (SERVICE_HOSTD_URL): round trips of text, bytes and
a 16 MiB stream, what code and the files API see of each other's writes, directories both ways,
and the exception classes; the asyncio flavour too. Skipped without SERVICE_HOSTD_URL, and each
test skips itself while the server has no files API (it answers route_not_found)."""

import asyncio
import hashlib
import os
import shutil
import tempfile
import unittest

from _features import lacks
from _support import LIVE_URL, SKIP_LIVE_REASON
from _trees import awkward_tree, make_tree, read_tree

from hostd import AsyncSandbox, InvalidRequestError, Sandbox, SandboxFileNotFoundError, SandboxNotFoundError


@unittest.skipUnless(LIVE_URL, SKIP_LIVE_REASON)
class LiveFilesTest(unittest.TestCase):
    sandbox = None

    @classmethod
    def tearDownClass(cls):
        if cls.sandbox is not None:
            try:
                cls.sandbox.delete()
            except SandboxNotFoundError:
                pass

    def setUp(self):
        reason = lacks("files")
        if reason:
            self.skipTest(reason)
        if LiveFilesTest.sandbox is None:
            LiveFilesTest.sandbox = Sandbox.create()
        self.s = LiveFilesTest.sandbox
        self.work = tempfile.mkdtemp(prefix="hostd-py-live-files-")
        self.addCleanup(shutil.rmtree, self.work, True)

    def test_text_and_bytes_round_trip_and_code_sees_them(self):
        files = self.s.files
        self.assertEqual(files.write("/root/t/hello.txt", "h\u00e9llo\n", mode=0o600), {"path": "/root/t/hello.txt", "size": 7})
        self.assertEqual(files.read("/root/t/hello.txt"), "h\u00e9llo\n".encode())
        entry = files.stat("/root/t/hello.txt")
        self.assertEqual((entry["type"], entry["size"], entry["mode"]), ("file", 7, 0o600))
        self.assertEqual(self.s.run('print(open("/root/t/hello.txt").read(), end="")').stdout, "h\u00e9llo\n")
        self.s.run('open("/root/t/from-code.bin", "wb").write(bytes(range(256)))')
        self.assertEqual(files.read("/root/t/from-code.bin"), bytes(range(256)))
        self.assertEqual([e["name"] for e in files.list("/root/t")], ["from-code.bin", "hello.txt"])
        files.mkdir("/root/t/a/b")
        self.assertEqual(files.stat("/root/t/a/b")["type"], "dir")
        files.remove("/root/t", recursive=True)
        with self.assertRaises(SandboxFileNotFoundError):
            files.stat("/root/t")

    def test_a_16_mib_stream_goes_up_and_comes_back_intact(self):
        chunks = [os.urandom(1 << 20) for _ in range(16)]
        expected = hashlib.sha256(b"".join(chunks)).hexdigest()
        self.assertEqual(self.s.files.write("/root/big.bin", iter(chunks))["size"], 16 << 20)
        got = hashlib.sha256()
        with self.s.files.read_stream("/root/big.bin") as stream:
            for chunk in stream:
                got.update(chunk)
        self.assertEqual(got.hexdigest(), expected)

    def test_a_directory_goes_up_and_comes_back_as_the_same_tree(self):
        src = os.path.join(self.work, "src")
        make_tree(src, awkward_tree())
        info = self.s.files.upload_dir(src, "/root/tree")
        # Members extracted: 6 files, the link and 5 directories (docs/api.md, Files).
        self.assertEqual((info["path"], info["files"]), ("/root/tree", 12))
        out = os.path.join(self.work, "out")
        self.s.files.download_dir("/root/tree", out)
        self.assertEqual(read_tree(out), read_tree(src))

    def test_the_exception_classes_of_the_files_api(self):
        with self.assertRaises(SandboxFileNotFoundError) as caught:
            self.s.files.read("/root/no-such-file")
        self.assertIsInstance(caught.exception, FileNotFoundError)
        self.s.files.mkdir("/root/d")
        with self.assertRaises(InvalidRequestError) as caught:
            self.s.files.remove("/root/d")
        self.assertEqual(caught.exception.code, "is_a_directory")
        with self.assertRaises(InvalidRequestError) as caught:
            self.s.files.read("relative/path")
        self.assertEqual(caught.exception.code, "invalid_path")

    def test_the_asyncio_flavour(self):
        async def scenario():
            s = await AsyncSandbox.connect(self.s.id)
            await s.files.write("/root/async.txt", b"async")
            self.assertEqual(await s.files.read("/root/async.txt"), b"async")
            src = os.path.join(self.work, "asrc")
            make_tree(src, {"x/y.txt": ("file", "y\n", 0o644)})
            await s.files.upload_dir(src, "/root/atree")
            await s.files.download_dir("/root/atree", os.path.join(self.work, "aout"))
            self.assertEqual(read_tree(os.path.join(self.work, "aout")), read_tree(src))

        asyncio.run(scenario())


if __name__ == "__main__":
    unittest.main()
