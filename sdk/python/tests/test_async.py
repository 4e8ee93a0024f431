"""AsyncSandbox and its companions against the fake: they send exactly the requests the
blocking classes send, stream exec events as they arrive, map errors, retry and time out the
same way, move files and directories, and ``async with AsyncSandbox.create()`` deletes."""

import asyncio
import io
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from _support import SANDBOX_ID, FakeHostd
from _trees import awkward_tree, make_tree, read_tree
from test_lifecycle import SNAP, answer

from hostd import (
    AsyncSandbox,
    AsyncSnapshot,
    AsyncTemplate,
    ConnectionException,
    ExecutorError,
    RateLimitError,
    RequestTimeoutError,
    Sandbox,
    SandboxFileNotFoundError,
    Snapshot,
    Template,
    resolve_config,
)

IGNORED_HEADERS = {"traceparent", "host", "connection", "accept-encoding", "user-agent"}


def everything(req, res):
    """Answers every route with something plausible, for comparing requests."""
    if req.path.endswith("/exec"):
        res.start_stream()
        res.event("stdout", "out", 0)
        res.event("exit", 0, 1)
        return res.end_stream()
    if req.path.endswith("/fork"):
        return res.json(200, {"parent_id": SANDBOX_ID, "children": [{"id": SANDBOX_ID, "state": "ready"}]})
    if "/merge_into/" in req.path:
        return res.json(200, {"id": SANDBOX_ID, "state": "ready", "merged": SANDBOX_ID})
    if req.path.endswith("/logs"):
        return res.raw(200, b"console\n")
    if req.route.endswith("/files/list"):
        return res.json(200, {"entries": []})
    if req.route.endswith("/files/stat") or req.route.endswith("/files/mkdir"):
        return res.json(200, {"path": "/p"})
    if req.route.endswith("/files") and req.method == "PUT":
        return res.json(200, {"path": "/p", "size": len(req.body)})
    if req.route.endswith("/files") and req.method == "GET":
        return res.raw(200, b"bytes")
    if req.method == "GET" and req.path == "/v1/sandboxes":
        return res.json(200, {"sandboxes": []})
    if req.method == "GET" and req.path.startswith("/v1/sandboxes/"):
        return res.json(200, {"id": SANDBOX_ID, "state": "ready"})
    return answer(req, res)


class SameRequestsTest(unittest.IsolatedAsyncioTestCase):
    """Every method of the asyncio classes sends what its blocking twin sends."""

    def setUp(self):
        self.fake = FakeHostd(everything)
        self.addCleanup(self.fake.close)

    def recorded(self, start):
        return [
            (r.method, r.path, r.body, {k: v for k, v in r.headers.items() if k not in IGNORED_HEADERS})
            for r in self.fake.requests[start:]
        ]

    def blocking(self, url):
        s = Sandbox.create("python", api_key="k", base_url=url, env={"A": "1"}, allow_out=["*"], snapshot=None)
        Sandbox.connect(SANDBOX_ID, api_key="k", base_url=url)
        Sandbox.list(api_key="k", base_url=url)
        s.info()
        s.run("print(1)", "bash", 2.5, env={"B": "2"}, cwd="/tmp", display=True)
        s.fork(2)
        s.merge(SANDBOX_ID)
        s.snapshot()
        s.pause()
        s.resume()
        s.logs()
        s.files.write("/p", b"data", mode=0o600)
        s.files.read("/p")
        s.files.list("/")
        s.files.stat("/p")
        s.files.mkdir("/d")
        s.files.remove("/d", recursive=True)
        Snapshot.list(api_key="k", base_url=url)
        Snapshot.get(SNAP, api_key="k", base_url=url).delete()
        Template.list(api_key="k", base_url=url)
        Template.get("python", api_key="k", base_url=url)
        Template.log("python", api_key="k", base_url=url)
        s.delete()

    async def asynchronous(self, url):
        s = await AsyncSandbox.create("python", api_key="k", base_url=url, env={"A": "1"}, allow_out=["*"], snapshot=None)
        await AsyncSandbox.connect(SANDBOX_ID, api_key="k", base_url=url)
        await AsyncSandbox.list(api_key="k", base_url=url)
        await s.info()
        await s.run("print(1)", "bash", 2.5, env={"B": "2"}, cwd="/tmp", display=True)
        await s.fork(2)
        await s.merge(SANDBOX_ID)
        await s.snapshot()
        await s.pause()
        await s.resume()
        await s.logs()
        await s.files.write("/p", b"data", mode=0o600)
        await s.files.read("/p")
        await s.files.list("/")
        await s.files.stat("/p")
        await s.files.mkdir("/d")
        await s.files.remove("/d", recursive=True)
        await AsyncSnapshot.list(api_key="k", base_url=url)
        await (await AsyncSnapshot.get(SNAP, api_key="k", base_url=url)).delete()
        await AsyncTemplate.list(api_key="k", base_url=url)
        await AsyncTemplate.get("python", api_key="k", base_url=url)
        await AsyncTemplate.log("python", api_key="k", base_url=url)
        await s.delete()

    async def test_the_asyncio_classes_send_the_same_requests(self):
        await asyncio.get_running_loop().run_in_executor(None, self.blocking, self.fake.url)
        middle = len(self.fake.requests)
        await self.asynchronous(self.fake.url)
        self.assertEqual(self.recorded(middle), self.recorded(0)[:middle])
        self.assertEqual(len(self.fake.requests), 2 * middle)


class AsyncSandboxTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.fake = FakeHostd(everything)
        self.addCleanup(self.fake.close)
        self.config = resolve_config(base_url=self.fake.url)
        self.sandbox = AsyncSandbox(SANDBOX_ID, self.config)
        self.work = tempfile.mkdtemp(prefix="hostd-py-async-")
        self.addCleanup(shutil.rmtree, self.work, True)

    async def test_async_with_create_deletes_and_tolerates_a_sandbox_already_gone(self):
        async with AsyncSandbox.create(base_url=self.fake.url) as s:
            self.assertEqual(s.id, "sbx_" + "4" * 32)
        self.assertEqual([(r.method, r.path) for r in self.fake.requests[-2:]], [("POST", "/v1/sandboxes"), ("DELETE", "/v1/sandboxes/" + s.id)])
        self.fake.handler = lambda req, res: res.error(404, "gone", "sandbox_not_found") if req.method == "DELETE" else everything(req, res)
        async with await AsyncSandbox.create(base_url=self.fake.url):
            pass

    async def test_exec_yields_events_as_they_arrive_in_seq_order(self):
        # The fake sends the rest only once the client has yielded the first two events: an
        # SDK that held events back until the stream ended would leave it waiting
        yielded_two = threading.Event()
        released_by_client = []

        def handler(req, res):
            res.start_stream()
            res.event("stdout", "b", 1)
            res.event("stdout", "a", 0)
            released_by_client.append(yielded_two.wait(10))
            res.event("stderr", "c", 2)
            res.event("exit", 3, 3)
            res.end_stream()

        self.fake.handler = handler
        seen = []
        async for e in self.sandbox.exec("x"):
            seen.append((e.seq, e.type, e.data))
            if len(seen) == 2:
                yielded_two.set()
        self.assertEqual(seen, [(0, "stdout", "a"), (1, "stdout", "b"), (2, "stderr", "c"), (3, "exit", 3)])
        self.assertEqual(released_by_client, [True], "the first events were yielded before the rest came")

    async def test_an_in_stream_failure_or_a_missing_exit_is_executor_error(self):
        def failing(req, res):
            res.start_stream()
            res.event("stdout", "partial", 0)
            res.event("exit", -1, 1, error="the VM exited")
            res.end_stream()

        self.fake.handler = failing
        with self.assertRaises(ExecutorError) as caught:
            await self.sandbox.run("x")
        self.assertEqual((caught.exception.message, caught.exception.event.data), ("the VM exited", -1))

        def no_exit(req, res):
            res.start_stream()
            res.event("stdout", "a", 0)
            res.end_stream()

        self.fake.handler = no_exit
        with self.assertRaises(ExecutorError):
            await self.sandbox.run("x")

        def broken(req, res):
            res.start_stream()
            res.event("stdout", "a", 0)
            res.drop()

        self.fake.handler = broken
        with self.assertRaises(ExecutorError):
            await self.sandbox.run("x")

    async def test_leaving_the_loop_early_closes_the_connection(self):
        left = threading.Event()
        closed = threading.Event()

        def handler(req, res):
            res.start_stream()
            res.event("stdout", "first", 0)
            # Once the client has left the loop, its end is closed: writing fails, at the latest
            # once the kernel has the peer's reset (the first write may still be taken)
            left.wait(10)
            deadline = time.monotonic() + 10
            seq = 1
            while time.monotonic() < deadline:
                try:
                    res.event("stdout", "more", seq)
                except OSError:
                    closed.set()
                    return
                seq += 1
                time.sleep(0.01)

        self.fake.handler = handler
        events = self.sandbox.exec("x")
        async for e in events:
            self.assertEqual(e.data, "first")
            break
        await events.aclose()
        left.set()
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, closed.wait, 15))

    async def test_errors_retries_and_timeouts(self):
        count = []

        def refuse(req, res):
            count.append(req)
            res.error(429, "too many", "limit_reached", {"retry-after": "0"})

        self.fake.handler = refuse
        with self.assertRaises(RateLimitError) as caught:
            await AsyncSandbox.create(base_url=self.fake.url, max_retries=2)
        self.assertEqual((len(count), caught.exception.retry_after_ms), (3, 0))

        release = threading.Event()
        self.addCleanup(release.set)
        self.fake.handler = lambda req, res: release.wait(10)
        with self.assertRaises(RequestTimeoutError):
            await AsyncSandbox.create(base_url=self.fake.url, request_timeout=0.2)

        url = self.fake.url
        self.fake.close()
        with self.assertRaises(ConnectionException):
            await AsyncSandbox.create(base_url=url)

    async def test_files_both_ways(self):
        files = self.sandbox.files
        stored = {}

        def handler(req, res):
            if req.method == "PUT":
                stored[req.params["path"]] = req.body
                return res.json(200, {"path": req.params["path"], "size": len(req.body)})
            if req.params.get("path") == "/missing":
                return res.error(404, "/missing does not exist", "file_not_found")
            if req.params.get("format") == "tar":
                return res.raw(200, stored["/up"], "application/x-tar")
            return res.raw(200, stored[req.params["path"]])

        self.fake.handler = handler

        async def chunks():
            yield b"async "
            yield b"chunks"

        self.assertEqual(await files.write("/a", chunks()), {"path": "/a", "size": 12})
        self.assertEqual(await files.write("/b", io.BytesIO(b"file object")), {"path": "/b", "size": 11})
        self.assertEqual(await files.read("/a"), b"async chunks")
        stream = await files.read_stream("/b")
        async with stream:
            self.assertEqual(b"".join([c async for c in stream]), b"file object")
        with self.assertRaises(SandboxFileNotFoundError):
            await files.read("/missing")

        src = os.path.join(self.work, "src")
        make_tree(src, awkward_tree())
        await files.upload_dir(src, "/up")
        unpacked = os.path.join(self.work, "unpacked")
        os.mkdir(unpacked)
        subprocess.run(["tar", "-x", "-C", unpacked], input=stored["/up"], check=True)
        self.assertEqual(read_tree(unpacked), read_tree(src))
        out = os.path.join(self.work, "out")
        info = await files.download_dir("/up", out)
        self.assertEqual(read_tree(out), read_tree(src))
        self.assertEqual(info["files"], 6)


if __name__ == "__main__":
    unittest.main()
