"""Every request carries a well-formed ``traceparent``: the current OpenTelemetry span's ids
when ``opentelemetry`` is importable and a span is active, fresh random ids otherwise
(including when the package is absent). The OpenTelemetry API is faked: it is not installed
here, and only its ``get_current_span().get_span_context()`` surface is used."""

import re
import sys
import types
import unittest

from _support import SANDBOX_ID, FakeHostd, default_handler

from hostd import Sandbox, _trace, traceparent

FORMAT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def handler(req, res):
    if req.path.endswith("/exec"):
        res.start_stream()
        res.event("exit", 0, 0)
        return res.end_stream()
    if req.path.endswith("/fork"):
        child = {"id": "sbx_" + "c" * 32, "state": "ready"}
        return res.json(200, {"parent_id": SANDBOX_ID, "children": [child]})
    if "/merge_into/" in req.path:
        return res.json(200, {"id": SANDBOX_ID, "state": "ready", "merged": "sbx_" + "c" * 32})
    if req.method == "DELETE":
        return res.empty()
    if req.method == "GET" and req.path == "/v1/sandboxes":
        return res.json(200, {"sandboxes": []})
    return default_handler(req, res)


class _SpanContext:
    def __init__(self, trace_id, span_id, flags, valid=True):
        self.trace_id, self.span_id, self.trace_flags, self.is_valid = trace_id, span_id, flags, valid


class _Span:
    def __init__(self, ctx):
        self._ctx = ctx

    def get_span_context(self):
        return self._ctx


def install_fake_otel(span_context):
    """Puts a fake ``opentelemetry.trace`` whose current span has ``span_context``."""
    pkg = types.ModuleType("opentelemetry")
    trace = types.ModuleType("opentelemetry.trace")
    trace.get_current_span = lambda: _Span(span_context)
    pkg.trace = trace
    sys.modules["opentelemetry"] = pkg
    sys.modules["opentelemetry.trace"] = trace
    _trace.reset_for_tests()


class TraceparentTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd(handler)
        self.addCleanup(self.fake.close)
        saved = {k: sys.modules.get(k) for k in ("opentelemetry", "opentelemetry.trace")}

        def restore():
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
            _trace.reset_for_tests()

        self.addCleanup(restore)

    def every_kind_of_request(self):
        before = len(self.fake.requests)
        s = Sandbox.create(base_url=self.fake.url)
        s.run("1")
        [child] = s.fork(1)
        s.merge(child)
        Sandbox.list(base_url=self.fake.url)
        s.delete()
        headers = [r.headers.get("traceparent") for r in self.fake.requests[before:]]
        self.assertEqual(len(headers), 6)
        for h in headers:
            self.assertIsNotNone(h, "traceparent header missing")
        return headers

    def assert_fresh(self, headers):
        for h in headers:
            m = FORMAT.match(h)
            self.assertIsNotNone(m, "malformed traceparent %r" % h)
            self.assertNotEqual(set(m.group(1)), {"0"})
            self.assertNotEqual(set(m.group(2)), {"0"})
        self.assertEqual(len({h.split("-")[1] for h in headers}), len(headers), "trace ids repeat")
        self.assertEqual(len({h.split("-")[2] for h in headers}), len(headers), "span ids repeat")

    def test_every_request_has_a_fresh_well_formed_traceparent_without_opentelemetry(self):
        sys.modules["opentelemetry"] = None  # makes the import fail, as when it is not installed
        sys.modules["opentelemetry.trace"] = None
        _trace.reset_for_tests()
        self.assert_fresh(self.every_kind_of_request())
        self.assertIsNone(_trace._load_otel())

    def test_uses_the_current_span_when_one_is_active(self):
        install_fake_otel(_SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1))
        headers = self.every_kind_of_request()
        self.assertEqual(set(headers), {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        install_fake_otel(_SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 0))
        self.assertEqual(traceparent(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")

    def test_random_ids_when_no_span_is_active(self):
        install_fake_otel(_SpanContext(0, 0, 0, valid=False))  # what INVALID_SPAN looks like
        self.assert_fresh(self.every_kind_of_request())

    def test_a_broken_opentelemetry_does_not_break_requests(self):
        pkg = types.ModuleType("opentelemetry")
        trace = types.ModuleType("opentelemetry.trace")

        def boom():
            raise RuntimeError("broken")

        trace.get_current_span = boom
        sys.modules["opentelemetry"], sys.modules["opentelemetry.trace"] = pkg, trace
        _trace.reset_for_tests()
        self.assert_fresh(self.every_kind_of_request())


if __name__ == "__main__":
    unittest.main()
