"""The SDK against a real hostd (SERVICE_HOSTD_URL, SERVICE_API_KEY): create, persistent
state, exceptions, bash, streaming order, timeout, fork, merge, delete, the context manager and
the exception classes a real server produces. Skipped when SERVICE_HOSTD_URL is unset. Every
sandbox made here is deleted in tearDown, whatever happened."""

import os
import unittest

from _support import LIVE_URL, SKIP_LIVE_REASON

from hostd import (
    AuthenticationException,
    InvalidRequestException,
    NotFoundException,
    Sandbox,
    SandboxNotFoundError,
    TemplateNotFoundError,
    is_hostd_error,
)


@unittest.skipUnless(LIVE_URL, SKIP_LIVE_REASON)
class LiveTest(unittest.TestCase):
    def setUp(self):
        self.made = []

    def tearDown(self):
        for s in self.made:
            try:
                s.delete()
            except NotFoundException:
                pass

    def create(self):
        s = Sandbox.create()
        self.made.append(s)
        return s

    def test_create_connect_list(self):
        s = self.create()
        self.assertRegex(s.id, r"^sbx_[0-9a-f]{32}$")
        self.assertEqual(Sandbox.connect(s.id).id, s.id)
        self.assertEqual(s.info()["state"], "ready")
        self.assertIn(s.id, [i["id"] for i in Sandbox.list()])

    def test_python_state_persists(self):
        s = self.create()
        r = s.run("x = 41\nimport json")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("", "", 0))
        self.assertEqual(s.run('print(json.dumps({"x": x + 1}))').stdout, '{"x": 42}\n')
        self.assertEqual(s.run("x").stdout, "41\n", "a last expression is echoed like a notebook cell")

    def test_an_exception_exits_1_and_the_repl_survives(self):
        s = self.create()
        s.run('kept = "yes"')
        r = s.run('raise ValueError("boom")')
        self.assertEqual(r.exit_code, 1)
        self.assertRegex(r.stderr, r"Traceback[\s\S]*ValueError: boom")
        self.assertEqual(s.run("print(kept)").stdout, "yes\n")
        self.assertEqual(s.run("import sys; sys.exit(7)").exit_code, 7)

    def test_bash_is_fresh_each_time_and_the_filesystem_persists(self):
        s = self.create()
        r = s.run("V=1; echo out; echo err >&2; echo data > /root/f.txt; exit 5", language="bash")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 5))
        self.assertEqual(s.run('echo "[$V]"', language="bash").stdout, "[]\n")
        self.assertEqual(s.run('print(open("/root/f.txt").read(), end="")').stdout, "data\n")

    def test_exec_yields_events_in_order_as_they_are_produced(self):
        s = self.create()
        # Each line is printed only once the client has yielded the one before (it writes a
        # file the cell waits for): lines held back until the end would leave the cell waiting
        code = (
            "import os, sys, time\nfor i in range(3):\n    print(i, flush=True)\n"
            '    print("e", i, file=sys.stderr, flush=True)\n'
            "    deadline = time.monotonic() + 120\n"
            "    while not os.path.exists(f'/tmp/yielded-{i}'):\n"
            "        if time.monotonic() > deadline:\n            sys.exit('held back')\n"
            "        time.sleep(0.01)"
        )
        events = []
        for e in s.exec(code):
            events.append(e)
            if e.type == "stdout":
                s.files.write("/tmp/yielded-%s" % e.data, b"")
        self.assertEqual([e.seq for e in events], list(range(7)))
        # Each stream keeps its order; between stdout and stderr only seq is authoritative.
        self.assertEqual([e.data for e in events if e.type == "stdout"], ["0", "1", "2"])
        self.assertEqual([e.data for e in events if e.type == "stderr"], ["e 0", "e 1", "e 2"])
        self.assertEqual((events[-1].type, events[-1].data), ("exit", 0))

    def test_timeout_interrupts_with_exit_code_124(self):
        s = self.create()
        s.run("alive = True")
        r = s.run("import time\ntime.sleep(60)", timeout=1)
        self.assertEqual(r.exit_code, 124)
        self.assertIn("hostd: execution timed out", r.stderr)
        self.assertEqual(s.run("print(alive)").stdout, "True\n")

    def test_fork_gives_isolated_children_that_inherit_the_state(self):
        parent = self.create()
        parent.run('x = "parent"')
        children = parent.fork(2)
        self.made.extend(children)
        self.assertEqual(len({parent.id, children[0].id, children[1].id}), 3)
        for c in children:
            self.assertEqual(c.run("print(x)").stdout, "parent\n")
        children[0].run('x = "child 0"')
        self.assertEqual(children[1].run("print(x)").stdout, "parent\n")
        self.assertEqual(parent.run("print(x)").stdout, "parent\n")
        self.assertEqual(children[0].info()["parent_id"], parent.id)

    def test_merge_adopts_the_winners_state_and_consumes_it(self):
        parent = self.create()
        parent.run("x = 0")
        a, b = parent.fork(2)
        self.made.extend([a, b])
        a.run("x = 1")
        b.run("x = 2")
        parent.merge(a)
        self.assertEqual(parent.run("print(x)").stdout, "1\n")
        with self.assertRaises(NotFoundException):
            Sandbox.connect(a.id)
        with self.assertRaises(NotFoundException):
            parent.merge(a.id)
        self.assertEqual(b.run("print(x)").stdout, "2\n", "siblings are untouched")
        with self.assertRaises(InvalidRequestException):
            parent.merge(parent)

    def test_delete_and_the_context_manager(self):
        s = self.create()
        s.delete()
        with self.assertRaises(NotFoundException):
            Sandbox.connect(s.id)
        with self.assertRaises(NotFoundException) as caught:
            s.delete()
        self.assertEqual(caught.exception.status, 404)
        with self.assertRaises(NotFoundException):
            s.run("1")
        with Sandbox.create() as t:
            self.made.append(t)
            self.assertEqual(t.run("print(1)").stdout, "1\n")
        with self.assertRaises(NotFoundException):
            Sandbox.connect(t.id)

    def test_the_exception_classes_a_real_server_produces(self):
        with self.assertRaises(SandboxNotFoundError) as caught:
            Sandbox.connect("sbx_" + "0" * 32)
        self.assertIsInstance(caught.exception, NotFoundException, "the first version's name still catches it")
        self.assertEqual((caught.exception.code, caught.exception.status), ("sandbox_not_found", 404))
        with self.assertRaises(TemplateNotFoundError):
            Sandbox.create(template="no-such-template")
        s = self.create()
        with self.assertRaises(InvalidRequestException) as caught:
            s.fork(33)
        self.assertEqual((caught.exception.code, caught.exception.status), ("invalid_request", 400))
        with self.assertRaises(InvalidRequestException) as caught:
            s.merge(s)
        self.assertEqual(caught.exception.code, "merge_into_self")
        with self.assertRaises(InvalidRequestException):
            s.run("1", timeout=-5)
        with self.assertRaises(InvalidRequestException):
            s.run("1", language="ruby")
        if not os.environ.get("SERVICE_API_KEY"):
            self.skipTest("SERVICE_API_KEY unset: assuming the server does not check keys; 401 not tested")
        with self.assertRaises(AuthenticationException) as caught:
            Sandbox.create(api_key="definitely-not-a-valid-key")
        self.assertEqual(caught.exception.code, "invalid_api_key")
        self.assertTrue(is_hostd_error(caught.exception, "authentication_error"))
        with self.assertRaises(AuthenticationException) as caught:
            Sandbox.list(api_key="")
        self.assertEqual(caught.exception.code, "missing_api_key")


if __name__ == "__main__":
    unittest.main()
