"""Exception classes: every status maps onto its class with the server's message, codes are
stable and shared with the TypeScript SDK, and is_hostd_error recognises exceptions from
another copy of the package."""

import importlib.util
import os
import shutil
import tempfile
import unittest

from _support import SDK_DIR, FakeHostd

import hostd
from hostd import (
    AuthenticationException,
    ConnectionException,
    ExecutorException,
    HostdException,
    InvalidRequestException,
    LimitReachedException,
    NotFoundException,
    Sandbox,
    UnavailableException,
    is_hostd_error,
)

CASES = [
    (400, InvalidRequestException, "invalid_request"),
    (401, AuthenticationException, "authentication_error"),
    (403, AuthenticationException, "authentication_error"),
    (404, NotFoundException, "not_found"),
    (405, InvalidRequestException, "invalid_request"),
    (413, InvalidRequestException, "invalid_request"),
    (415, InvalidRequestException, "invalid_request"),
    (429, LimitReachedException, "limit_reached"),
    (500, ExecutorException, "executor_error"),
    (502, UnavailableException, "unavailable"),
    (503, UnavailableException, "unavailable"),
    (501, HostdException, "hostd_error"),
]


class StatusMappingTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)

    def test_every_status_maps_to_its_class_with_the_servers_message(self):
        for status, cls, code in CASES:
            with self.subTest(status=status):
                self.fake.handler = lambda req, res, s=status: res.error(s, "message for %d" % s)
                with self.assertRaises(cls) as caught:
                    Sandbox.create(base_url=self.fake.url)
                e = caught.exception
                self.assertIs(type(e), cls)
                self.assertIsInstance(e, HostdException)
                self.assertEqual(e.code, code)
                self.assertEqual(e.status, status)
                self.assertEqual(e.message, "message for %d" % status)
                self.assertEqual(str(e), "message for %d" % status)
                self.assertTrue(is_hostd_error(e))
                self.assertTrue(is_hostd_error(e, code))

    def test_a_body_that_is_not_json_still_gives_a_readable_message(self):
        self.fake.handler = lambda req, res: res.raw(502, b"<html>Bad Gateway</html>", "text/html")
        with self.assertRaises(UnavailableException) as caught:
            Sandbox.create(base_url=self.fake.url)
        self.assertEqual(caught.exception.message, "<html>Bad Gateway</html>")

    def test_an_empty_error_body_gives_the_status_line(self):
        self.fake.handler = lambda req, res: res.raw(500, b"")
        with self.assertRaises(ExecutorException) as caught:
            Sandbox.create(base_url=self.fake.url)
        self.assertEqual(caught.exception.message, "HTTP 500 Internal Server Error")

    def test_no_server_is_a_connection_exception(self):
        url = self.fake.url
        self.fake.close()
        with self.assertRaises(ConnectionException) as caught:
            Sandbox.create(base_url=url)
        self.assertEqual(caught.exception.code, "connection_error")
        self.assertIsNone(caught.exception.status)
        self.assertIn("cannot reach hostd at %s" % url, caught.exception.message)


class IsHostdErrorTest(unittest.TestCase):
    def test_rejects_other_things(self):
        self.assertFalse(is_hostd_error(Exception("x")))
        self.assertFalse(is_hostd_error(None))
        self.assertFalse(is_hostd_error("not_found"))
        e = NotFoundException("gone", 404)
        self.assertTrue(is_hostd_error(e, "not_found"))
        self.assertFalse(is_hostd_error(e, "executor_error"))
        self.assertNotIsInstance(e, ExecutorException)

    def test_recognises_exceptions_from_another_copy_of_the_package(self):
        tmp = tempfile.mkdtemp(prefix="hostd-copy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        target = os.path.join(tmp, "hostd_copy")
        shutil.copytree(os.path.join(SDK_DIR, "hostd"), target, ignore=shutil.ignore_patterns("__pycache__"))
        spec = importlib.util.spec_from_file_location(
            "hostd_copy", os.path.join(target, "__init__.py"), submodule_search_locations=[target]
        )
        copy = importlib.util.module_from_spec(spec)
        import sys

        sys.modules["hostd_copy"] = copy
        self.addCleanup(sys.modules.pop, "hostd_copy", None)
        spec.loader.exec_module(copy)
        self.assertIsNot(copy.NotFoundException, NotFoundException)
        foreign = copy.NotFoundException("sandbox x not found", 404)
        self.assertTrue(is_hostd_error(foreign, "not_found"))
        self.assertFalse(is_hostd_error(foreign, "executor_error"))
        self.assertTrue(copy.is_hostd_error(ExecutorException("vm died"), "executor_error"))

    def test_codes_match_the_typescript_sdk(self):
        self.assertEqual(
            sorted(cls.code for cls in (
                HostdException, AuthenticationException, NotFoundException, InvalidRequestException,
                ExecutorException, LimitReachedException, UnavailableException, ConnectionException,
            )),
            sorted([
                "hostd_error", "authentication_error", "not_found", "invalid_request",
                "executor_error", "limit_reached", "unavailable", "connection_error",
            ]),
        )
        self.assertEqual(hostd.error_for_status(404, "x").code, "not_found")


if __name__ == "__main__":
    unittest.main()
