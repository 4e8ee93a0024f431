"""Timeouts: a server silent for longer than request_timeout (before its answer, or in the
middle of a body) gives RequestTimeoutError; an exec stream may stay silent for its own timeout
plus request_timeout, and forever when it has no timeout."""

import os
import threading
import time
import unittest
from unittest import mock

from _support import SANDBOX_ID, FakeHostd

from hostd import ConnectionException, RequestTimeoutError, Sandbox, resolve_config


class RequestTimeoutTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.release = threading.Event()
        self.addCleanup(self.fake.close)
        self.addCleanup(self.release.set)

    def silent(self, req, res):
        self.release.wait(10)

    def test_no_answer_within_the_timeout_is_request_timeout_error(self):
        self.fake.handler = self.silent
        start = time.monotonic()
        with self.assertRaises(RequestTimeoutError) as caught:
            Sandbox.create(base_url=self.fake.url, request_timeout=0.2)
        self.assertGreaterEqual(time.monotonic() - start, 0.2)
        self.assertIsInstance(caught.exception, ConnectionException)
        self.assertEqual(caught.exception.code, "request_timeout")

    def test_a_body_that_stalls_is_request_timeout_error(self):
        def stall(req, res):
            res._h.send_response(200)
            res._h.send_header("content-length", "100")
            res._h.end_headers()
            res._h.wfile.write(b'{"id":')
            res._h.wfile.flush()
            self.release.wait(10)

        self.fake.handler = stall
        with self.assertRaises(RequestTimeoutError):
            Sandbox.create(base_url=self.fake.url, request_timeout=0.2)

    def test_service_request_timeout_s_sets_it(self):
        self.fake.handler = self.silent
        with mock.patch.dict(os.environ, {"SERVICE_REQUEST_TIMEOUT_S": "0.2"}):
            with self.assertRaises(RequestTimeoutError):
                Sandbox.create(base_url=self.fake.url)


class ExecStreamTimeoutTest(unittest.TestCase):
    def setUp(self):
        self.pause = 0.0
        self.release = threading.Event()

        def handler(req, res):
            res.start_stream()
            self.release.wait(self.pause)
            res.event("stdout", "late", 0)
            res.event("exit", 0, 1)
            res.end_stream()

        self.fake = FakeHostd(handler)
        self.addCleanup(self.fake.close)
        self.addCleanup(self.release.set)
        self.sandbox = Sandbox(SANDBOX_ID, resolve_config(base_url=self.fake.url, request_timeout=0.2))

    def test_a_running_exec_may_stay_silent_for_its_timeout_plus_the_request_timeout(self):
        self.pause = 0.4  # longer than request_timeout alone
        # Well within the sum: the silence ends on a timer, which a loaded host can fire late.
        self.assertEqual([e.data for e in self.sandbox.exec("x", timeout=1.0)], ["late", 0])

    def test_silence_past_that_is_request_timeout_error(self):
        self.pause = 5
        start = time.monotonic()
        with self.assertRaises(RequestTimeoutError):
            list(self.sandbox.exec("x", timeout=0.1))
        waited = time.monotonic() - start
        self.assertTrue(0.3 <= waited < 4, waited)

    def test_an_exec_without_timeout_waits_as_long_as_the_code_runs(self):
        self.pause = 0.6
        self.assertEqual([e.data for e in self.sandbox.exec("x")], ["late", 0])


if __name__ == "__main__":
    unittest.main()
