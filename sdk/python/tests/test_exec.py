"""The exec stream against a scripted fake: lines split across chunks, events put in seq
order, yielded as they arrive, the in-stream failure report and a missing exit event raising
ExecutorException, closing early closing the connection, and run()'s collected output."""

import threading
import time
import unittest

from _support import SANDBOX_ID, FakeHostd, default_handler

from hostd import ExecutorException, Sandbox, is_hostd_error


def script(*parts):
    """A handler that streams ``parts``: (kind, data, seq[, extra]) tuples, bytes written as
    they are, and numbers as pauses in seconds."""

    def handler(req, res):
        if not req.path.endswith("/exec"):
            return default_handler(req, res)
        res.start_stream()
        for part in parts:
            if isinstance(part, (int, float)):
                time.sleep(part)
            elif isinstance(part, bytes):
                res.write(part)
            else:
                kind, data, seq = part[:3]
                res.event(kind, data, seq, **(part[3] if len(part) > 3 else {}))
        res.end_stream()

    return handler


class ExecTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)
        self.sandbox = Sandbox.connect(SANDBOX_ID, base_url=self.fake.url)

    def test_sends_code_language_and_timeout_and_yields_events(self):
        self.fake.handler = script(("stdout", "hi", 0), ("exit", 0, 1))
        events = list(self.sandbox.exec('print("hi")', language="bash", timeout=1.5))
        self.assertEqual(
            [(e.type, e.data, e.seq) for e in events], [("stdout", "hi", 0), ("exit", 0, 1)]
        )
        req = self.fake.requests[-1]
        self.assertEqual((req.method, req.path), ("POST", "/v1/sandboxes/%s/exec" % SANDBOX_ID))
        self.assertEqual(req.json(), {"code": 'print("hi")', "language": "bash", "timeout": 1.5})
        self.assertEqual(req.headers["content-type"], "application/json")

    def test_sends_env_cwd_and_display_as_docs_api_md_names_them(self):
        self.fake.handler = script(("exit", 0, 0))
        list(self.sandbox.exec("1", env={"A": "1", "B": ""}, cwd="/tmp", display=True))
        self.assertEqual(
            self.fake.requests[-1].json(),
            {"code": "1", "language": "python", "env": {"A": "1", "B": ""}, "cwd": "/tmp", "display": True},
        )

    def test_no_timeout_field_without_a_timeout(self):
        self.fake.handler = script(("exit", 0, 0))
        list(self.sandbox.exec("1"))
        self.assertEqual(self.fake.requests[-1].json(), {"code": "1", "language": "python"})

    def test_reassembles_lines_split_across_chunks_including_a_multibyte_character(self):
        line = '{"type":"stdout","data":"h\u00e9llo","seq":0,"ts":1}\n{"type":"exit","data":0,"seq":1,"ts":2}\n'
        data = line.encode("utf-8")
        cut = data.index("\u00e9".encode("utf-8")) + 1
        self.fake.handler = script(data[:cut], 0.03, data[cut : cut + 5], 0.03, data[cut + 5 :])
        self.assertEqual([e.data for e in self.sandbox.exec("x")], ["h\u00e9llo", 0])

    def test_puts_out_of_order_events_back_in_seq_order(self):
        self.fake.handler = script(
            ("stdout", "b", 1), ("stderr", "c", 2), ("stdout", "a", 0), ("exit", 3, 4), ("stdout", "d", 3)
        )
        self.assertEqual(
            ["%d:%s:%s" % (e.seq, e.type, e.data) for e in self.sandbox.exec("x")],
            ["0:stdout:a", "1:stdout:b", "2:stderr:c", "3:stdout:d", "4:exit:3"],
        )

    def test_yields_each_line_as_it_arrives(self):
        # The fake sends each line only once the client has yielded the one before: an SDK
        # that held lines back would leave it waiting (and the wait would time out)
        yielded = [threading.Event() for _ in range(3)]
        released_by_client = []

        def handler(req, res):
            res.start_stream()
            for i in range(3):
                res.event("stdout", str(i), i)
                released_by_client.append(yielded[i].wait(10))
            res.event("exit", 0, 3)
            res.end_stream()

        self.fake.handler = handler
        for e in self.sandbox.exec("x"):
            if e.type == "stdout":
                yielded[e.seq].set()
        self.assertEqual(released_by_client, [True, True, True])

    def test_exit_with_error_raises_executor_exception_after_the_lines_before_it(self):
        self.fake.handler = script(
            ("stdout", "partial", 0),
            ("stderr", "hostd: executor error: the VM exited (signal SIGKILL)", 1),
            ("exit", -1, 2, {"error": "the VM exited (signal SIGKILL)"}),
        )
        seen = []
        with self.assertRaises(ExecutorException) as caught:
            for e in self.sandbox.exec("x"):
                seen.append(e.data)
        self.assertEqual(seen, ["partial", "hostd: executor error: the VM exited (signal SIGKILL)"])
        self.assertEqual(caught.exception.message, "the VM exited (signal SIGKILL)")
        self.assertEqual(caught.exception.code, "executor_error")
        self.assertIsNone(caught.exception.status)
        self.assertEqual(caught.exception.event.data, -1)

    def test_run_raises_for_the_in_stream_failure_too(self):
        self.fake.handler = script(("exit", -1, 0, {"error": "the guest agent did not respond"}))
        with self.assertRaises(ExecutorException) as caught:
            self.sandbox.run("x")
        self.assertTrue(is_hostd_error(caught.exception, "executor_error"))

    def test_a_stream_without_an_exit_event_raises_executor_exception(self):
        self.fake.handler = script(("stdout", "a", 0))
        with self.assertRaises(ExecutorException) as caught:
            list(self.sandbox.exec("x"))
        self.assertEqual((caught.exception.code, caught.exception.status), ("executor_error", None))

    def test_a_connection_that_breaks_mid_stream_raises_executor_exception(self):
        got_first = threading.Event()

        def handler(req, res):
            res.start_stream()
            res.event("stdout", "a", 0)
            got_first.wait(10)      # mid-stream: the client has the stream's first event
            res.drop()

        self.fake.handler = handler
        events = self.sandbox.exec("x")
        self.assertEqual(next(events).data, "a")
        got_first.set()
        with self.assertRaises(ExecutorException):
            list(events)

    def test_a_malformed_line_raises_executor_exception(self):
        self.fake.handler = script(b"not json\n", ("exit", 0, 0))
        with self.assertRaises(ExecutorException) as caught:
            list(self.sandbox.exec("x"))
        self.assertEqual((caught.exception.code, caught.exception.status), ("executor_error", None))

    def test_500_before_the_stream_is_executor_exception_with_status(self):
        self.fake.handler = lambda req, res: res.error(500, "the VM failed to start: qemu exited")
        with self.assertRaises(ExecutorException) as caught:
            self.sandbox.run("x")
        e = caught.exception
        self.assertEqual((e.status, e.message), (500, "the VM failed to start: qemu exited"))

    def test_unknown_event_types_are_skipped(self):
        self.fake.handler = script(("progress", "x", 0), ("stdout", "a", 1), ("exit", 0, 2))
        self.assertEqual([e.type for e in self.sandbox.exec("x")], ["stdout", "exit"])

    def test_run_joins_lines_and_calls_the_callbacks(self):
        self.fake.handler = script(
            ("stdout", "one", 0), ("stderr", "warn", 1), ("stdout", "two", 2), ("stdout", "", 3), ("exit", 3, 4)
        )
        out, err = [], []
        result = self.sandbox.run("x", on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(
            (result.stdout, result.stderr, result.exit_code), ("one\ntwo\n\n", "warn\n", 3)
        )
        self.assertEqual(out, ["one", "two", ""])
        self.assertEqual(err, ["warn"])

    def test_run_of_code_without_output(self):
        self.fake.handler = script(("exit", 0, 0))
        result = self.sandbox.run("x = 1")
        self.assertEqual((result.stdout, result.stderr, result.exit_code), ("", "", 0))

    def test_closing_the_generator_early_closes_the_connection(self):
        left = threading.Event()
        closed = threading.Event()

        def handler(req, res):
            res.start_stream()
            res.event("stdout", "first", 0)
            # Once the client has closed the generator, its end is closed: writing fails, at the
            # latest once the kernel has the peer's reset (the first write may still be taken)
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
        self.assertEqual(next(events).data, "first")
        events.close()
        left.set()
        self.assertTrue(closed.wait(15), "the server did not see the connection close")


if __name__ == "__main__":
    unittest.main()
