"""Retries: 429 and 503 are sent again, after Retry-After or a backoff, at most max_retries
times; nothing else is retried; an exec is retried only when it was refused before any event;
a one-shot upload stream never is."""

import io
import time
import unittest

from _support import SANDBOX_ID, FakeHostd

from hostd import (
    ExecutorError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    Sandbox,
    ShuttingDownError,
    resolve_config,
)
from hostd._retry import FIRST_BACKOFF_MS, parse_retry_after, retry_delay_ms


def refusing(refusals, status, code, retry_after, then):
    """Answers the first ``refusals`` requests with ``status``, then hands over to ``then``."""
    seen = []

    def handler(req, res):
        seen.append(req)
        if len(seen) <= refusals:
            headers = {} if retry_after is None else {"retry-after": retry_after}
            return res.error(status, "refused %d" % len(seen), code, headers)
        return then(req, res)

    return handler


def created(req, res):
    res.json(200, {"id": SANDBOX_ID, "state": "ready"})


class RetryTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)

    def requests_during(self, fn):
        start = len(self.fake.requests)
        try:
            value = fn()
        except Exception as e:  # the value under test
            value = e
        return value, len(self.fake.requests) - start

    def test_429_and_503_are_retried_after_retry_after_until_success(self):
        self.fake.handler = refusing(1, 429, "limit_reached", "0", refusing(1, 503, "insufficient_resources", "0", created))
        value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url))
        self.assertIsInstance(value, Sandbox)
        self.assertEqual(n, 3)

    def test_without_retry_after_the_first_retry_waits_the_first_backoff(self):
        self.fake.handler = refusing(1, 503, "shutting_down", None, created)
        start = time.monotonic()
        value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url))
        self.assertIsInstance(value, Sandbox)
        self.assertEqual(n, 2)
        self.assertGreaterEqual(time.monotonic() - start, FIRST_BACKOFF_MS / 1000)

    def test_after_max_retries_the_error_goes_to_the_caller(self):
        self.fake.handler = refusing(100, 429, "limit_reached", "0", created)
        value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url))
        self.assertIsInstance(value, RateLimitError)
        self.assertEqual((value.retry_after_ms, n), (0, 4))
        value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url, max_retries=0))
        self.assertEqual(n, 1)

    def test_a_retry_after_over_30_s_is_not_waited_for(self):
        self.fake.handler = refusing(100, 503, "shutting_down", "120", created)
        value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url))
        self.assertIsInstance(value, ShuttingDownError)
        self.assertEqual((value.retry_after_ms, n), (120000, 1))

    def test_no_other_error_is_retried(self):
        for status, code, cls in [
            (400, "invalid_request", InvalidRequestError),
            (404, "sandbox_not_found", NotFoundError),
            (500, "executor_error", ExecutorError),
        ]:
            with self.subTest(status=status):
                self.fake.handler = refusing(100, status, code, "0", created)
                value, n = self.requests_during(lambda: Sandbox.create(base_url=self.fake.url))
                self.assertIsInstance(value, cls)
                self.assertEqual(n, 1)

    def test_an_exec_refused_before_any_event_is_retried_a_started_one_never(self):
        def stream(req, res):
            res.start_stream()
            res.event("stdout", "ran", 0)
            res.event("exit", -1, 1, error="the VM exited")
            res.end_stream()

        self.fake.handler = refusing(1, 429, "limit_reached", "0", stream)
        sandbox = Sandbox(SANDBOX_ID, resolve_config(base_url=self.fake.url))
        seen = []

        def consume():
            for e in sandbox.exec("x"):
                seen.append(e.data)

        value, n = self.requests_during(consume)
        self.assertIsInstance(value, ExecutorError)
        self.assertEqual((seen, n), (["ran"], 2))

    def test_a_one_shot_upload_is_not_retried_bytes_are(self):
        written = lambda req, res: res.json(200, {"path": "/f", "size": len(req.body)})  # noqa: E731
        sandbox = Sandbox(SANDBOX_ID, resolve_config(base_url=self.fake.url))
        self.fake.handler = refusing(1, 503, "insufficient_resources", "0", written)
        value, n = self.requests_during(lambda: sandbox.files.write("/f", io.BytesIO(b"abc")))
        self.assertEqual((type(value).__name__, n), ("InsufficientResourcesError", 1))
        self.fake.handler = refusing(1, 503, "insufficient_resources", "0", written)
        value, n = self.requests_during(lambda: sandbox.files.write("/f", b"abc"))
        self.assertEqual((value, n), ({"path": "/f", "size": 3}, 2))
        self.assertEqual([r.body for r in self.fake.requests[-2:]], [b"abc", b"abc"])


class DelayTest(unittest.TestCase):
    def test_backoff_doubles_from_half_a_second_to_8_s_with_up_to_a_quarter_of_jitter(self):
        none = lambda: 0.0  # noqa: E731
        self.assertEqual([retry_delay_ms(503, None, a, 9, none) for a in range(6)], [500, 1000, 2000, 4000, 8000, 8000])
        self.assertEqual(retry_delay_ms(429, None, 0, 9, lambda: 1.0), 625)

    def test_retry_after_wins_up_to_30_s_and_other_statuses_give_up(self):
        self.assertEqual(retry_delay_ms(503, 10000, 0, 3), 10000)
        self.assertIsNone(retry_delay_ms(503, 30001, 0, 3))
        self.assertIsNone(retry_delay_ms(503, 0, 3, 3))
        self.assertIsNone(retry_delay_ms(500, 0, 0, 3))
        self.assertIsNone(retry_delay_ms(502, 0, 0, 3))

    def test_retry_after_is_seconds_or_an_http_date(self):
        now = 1795428000.0  # 2026-11-23T10:00:00Z
        self.assertEqual(parse_retry_after("5", now), 5000)
        self.assertEqual(parse_retry_after("Mon, 23 Nov 2026 10:00:07 GMT", now), 7000)
        self.assertEqual(parse_retry_after("Mon, 23 Nov 2026 09:00:00 GMT", now), 0)
        self.assertIsNone(parse_retry_after("soon", now))
        self.assertIsNone(parse_retry_after(None, now))


if __name__ == "__main__":
    unittest.main()
