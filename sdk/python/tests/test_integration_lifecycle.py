"""The API beyond exec, fork and merge against the real hostd (SERVICE_HOSTD_URL): templates,
a sandbox's env and an exec's env and cwd, rich outputs, snapshots, pause and resume, an egress
rule, and AsyncSandbox end to end. Skipped without SERVICE_HOSTD_URL; each test skips itself
while the server lacks its feature (a route answering route_not_found, or a field it rejects)."""

import asyncio
import http.server
import threading
import unittest

from _features import lacks
from _support import LIVE_URL, SKIP_LIVE_REASON

from hostd import (
    AsyncSandbox,
    NotFoundError,
    Sandbox,
    Snapshot,
    SnapshotNotFoundError,
    Template,
    TemplateNotFoundError,
)


@unittest.skipUnless(LIVE_URL, SKIP_LIVE_REASON)
class LiveLifecycleTest(unittest.TestCase):
    def setUp(self):
        self.made = []

    def tearDown(self):
        for thing in self.made:
            try:
                thing.delete()
            except NotFoundError:
                pass

    def create(self, **kwargs):
        s = Sandbox.create(**kwargs)
        self.made.append(s)
        return s

    def need(self, *features):
        reason = lacks(*features)
        if reason:
            self.skipTest(reason)

    def test_templates(self):
        self.need("templates")
        templates = Template.list()
        self.assertTrue(templates[0]["default"])
        self.assertEqual(Template.get(templates[0]["name"]), templates[0])
        with self.assertRaises(TemplateNotFoundError):
            Template.get("hostd-sdk-no-such-template")
        with self.assertRaises(TemplateNotFoundError):
            Sandbox.create(template="hostd-sdk-no-such-template")

    def test_a_sandboxs_env_and_an_execs_own_env_and_cwd(self):
        self.need("create-options", "exec-options")
        s = self.create(env={"GREETING": "hi", "SHARED": "sandbox"})
        self.assertEqual(s.run('import os; print(os.environ["GREETING"])').stdout, "hi\n")
        self.assertEqual(s.run('echo "$GREETING"', language="bash").stdout, "hi\n")
        code = 'import os; print(os.environ["SHARED"], os.getcwd())'
        self.assertEqual(s.run(code, env={"SHARED": "exec"}, cwd="/tmp").stdout, "exec /tmp\n")
        self.assertEqual(s.run(code).stdout, "sandbox /root\n")

    def test_rich_outputs_with_display(self):
        self.need("exec-options")
        s = self.create()
        code = 'class Bold:\n    def _repr_html_(self): return "<b>bold</b>"\n    def __repr__(self): return "Bold()"\ndisplay(Bold())\nBold()'
        r = s.run(code, display=True)
        self.assertEqual(r.exit_code, 0, r.stderr)
        self.assertEqual([(d.html, d.text) for d in r.displays], [("<b>bold</b>", "Bold()")] * 2)
        plain = s.run("Bold()")
        self.assertEqual((plain.stdout, plain.displays), ("Bold()\n", []))

    def test_a_snapshot_makes_sandboxes_in_its_state_until_deleted(self):
        self.need("snapshots")
        s = self.create()
        s.run("kept = 41")
        snap = s.snapshot()
        self.made.append(snap)
        self.assertEqual(snap.info["source_sandbox_id"], s.id)
        s.run("kept = 0")
        copy = self.create(snapshot=snap)
        self.assertEqual(copy.run("print(kept + 1)").stdout, "42\n")
        self.assertEqual(copy.info().get("snapshot_id"), snap.id)
        self.assertIn(snap.id, [x.id for x in Snapshot.list()])
        snap.delete()
        with self.assertRaises(SnapshotNotFoundError):
            Snapshot.get(snap.id)
        self.assertEqual(copy.run("print(kept)").stdout, "41\n")

    def test_pause_and_resume_keep_the_state(self):
        self.need("pause")
        s = self.create()
        s.run('kept = "yes"')
        s.pause()
        self.assertEqual(s.info()["state"], "paused")
        s.resume()
        self.assertEqual(s.info()["state"], "ready")
        s.pause()
        self.assertEqual(s.run("print(kept)").stdout, "yes\n")

    def test_allow_out_host_hostd_internal_reaches_this_host(self):
        self.need("create-options")

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("content-length", "13")
                self.end_headers()
                self.wfile.write(b"from the host")

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        port = server.server_address[1]
        fetch = 'import urllib.request\nprint(urllib.request.urlopen("http://host.hostd.internal:%d/", timeout=10).read().decode())' % port
        r = self.create(allow_out=["host.hostd.internal:%d" % port]).run(fetch)
        self.assertEqual((r.exit_code, r.stdout), (0, "from the host\n"), r.stderr)
        self.assertNotEqual(self.create().run(fetch).exit_code, 0, "no network without a rule")

    def test_async_sandbox_end_to_end(self):
        async def scenario():
            async with AsyncSandbox.create() as s:
                await s.run("x = 20")
                (child,) = await s.fork(1)
                await child.run("x += 1")
                await s.merge(child)
                events = [e async for e in s.exec("print(x * 2)")]
                self.assertEqual([(e.type, e.data) for e in events], [("stdout", "42"), ("exit", 0)])
            with self.assertRaises(NotFoundError):
                await AsyncSandbox.connect(s.id)

        asyncio.run(scenario())


if __name__ == "__main__":
    unittest.main()
