"""Exception classes: every code of docs/api.md maps onto its class, a response without a code
onto the class of its status, the exception keeps code, status, message and Retry-After, the
first SDK version's names still catch what they caught, and is_hostd_error recognises
exceptions from another copy of the package."""

import importlib.util
import os
import re
import shutil
import sys
import tempfile
import unittest

from _support import REPO_ROOT, SDK_DIR, FakeHostd

import hostd
from hostd import (
    AuthenticationError,
    AuthenticationException,
    ConnectionException,
    ContextExistsError,
    ContextNotFoundError,
    ExecutorError,
    ExecutorException,
    HostdError,
    HostdException,
    InsufficientResourcesError,
    InsufficientStorageError,
    InvalidRequestError,
    LimitReachedException,
    NotFoundError,
    NotFoundException,
    RateLimitError,
    RouteNotFoundError,
    Sandbox,
    SandboxDiskFullError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
    ShuttingDownError,
    SnapshotNotFoundError,
    StorageLimitError,
    TemplateFailedError,
    TemplateNotFoundError,
    TemplateUnavailableError,
    UnavailableError,
    UnavailableException,
    error_from_response,
    is_hostd_error,
)

#: The class each code of docs/api.md's Errors table must become.
BY_CODE = {
    "invalid_request": InvalidRequestError,
    "merge_into_self": InvalidRequestError,
    "invalid_path": InvalidRequestError,
    "is_a_directory": InvalidRequestError,
    "not_a_directory": InvalidRequestError,
    "invalid_archive": InvalidRequestError,
    "unsupported_file": InvalidRequestError,
    "permission_denied": InvalidRequestError,
    "missing_api_key": AuthenticationError,
    "invalid_api_key": AuthenticationError,
    "sandbox_not_found": SandboxNotFoundError,
    "template_not_found": TemplateNotFoundError,
    "snapshot_not_found": SnapshotNotFoundError,
    "file_not_found": SandboxFileNotFoundError,
    "route_not_found": RouteNotFoundError,
    "context_not_found": ContextNotFoundError,
    "context_exists": ContextExistsError,
    "context_is_default": InvalidRequestError,
    "sandbox_lost": SandboxLostError,
    "body_too_large": InvalidRequestError,
    "file_too_large": InvalidRequestError,
    "unsupported_media_type": InvalidRequestError,
    "headers_too_large": InvalidRequestError,
    "request_timeout": InvalidRequestError,
    "limit_reached": RateLimitError,
    "client_closed_request": InvalidRequestError,
    "executor_error": ExecutorError,
    "template_failed": TemplateFailedError,
    "internal_error": ExecutorError,
    "insufficient_resources": InsufficientResourcesError,
    "template_unavailable": TemplateUnavailableError,
    "shutting_down": ShuttingDownError,
    "sandbox_disk_full": SandboxDiskFullError,
    "storage_limit_reached": StorageLimitError,
    # Cluster mode's codes take the class of their status.
    "node_not_found": NotFoundError,
    "not_clustered": InvalidRequestError,
    "sandboxes_on_different_nodes": InvalidRequestError,
    "cluster_conflict": InvalidRequestError,
    "cluster_unavailable": UnavailableError,
    "node_unavailable": UnavailableError,
    "sandbox_moving": UnavailableError,
    "node_draining": UnavailableError,
    "hand_over_failed": UnavailableError,
}


def documented_codes():
    """``(status, code)`` of each row of docs/api.md's Errors section."""
    with open(os.path.join(REPO_ROOT, "docs", "api.md"), encoding="utf-8") as f:
        doc = f.read()
    section = doc[doc.index("\n## Errors") : doc.index("\n## Limits")]
    return [(int(s), c) for s, c in re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", section, re.M)]


class ByCodeTest(unittest.TestCase):
    def test_every_documented_code_becomes_its_class(self):
        codes = documented_codes()
        self.assertGreaterEqual(len(codes), 26)
        self.assertEqual(sorted(c for _, c in codes), sorted(BY_CODE))
        for status, code in codes:
            with self.subTest(code=code):
                e = error_from_response(status, code, "message for %s" % code)
                self.assertIs(type(e), BY_CODE[code])
                self.assertEqual((e.code, e.status, e.message, str(e)), (code, status, "message for %s" % code, e.message))
                self.assertIsInstance(e, HostdError)

    def test_the_first_versions_names_still_catch_what_they_caught(self):
        self.assertIs(HostdException, HostdError)
        self.assertIs(LimitReachedException, RateLimitError)
        for status, code, old in [
            (404, "sandbox_not_found", NotFoundException),
            (404, "template_not_found", NotFoundException),
            (410, "sandbox_lost", NotFoundException),
            (404, "file_not_found", NotFoundException),
            (500, "template_failed", ExecutorException),
            (503, "insufficient_resources", UnavailableException),
            (503, "template_unavailable", UnavailableException),
            (503, "shutting_down", UnavailableException),
            (401, "invalid_api_key", AuthenticationException),
            (507, "sandbox_disk_full", InsufficientStorageError),
        ]:
            with self.subTest(code=code):
                self.assertIsInstance(error_from_response(status, code, "m"), old)

    def test_a_missing_sandbox_file_is_also_the_builtin_file_not_found(self):
        e = error_from_response(404, "file_not_found", "/root/x does not exist")
        self.assertIsInstance(e, FileNotFoundError)
        self.assertEqual(str(e), "/root/x does not exist")
        try:
            raise e
        except FileNotFoundError as caught:
            self.assertIs(caught, e)

    def test_is_hostd_error_matches_the_code_and_the_codes_of_parent_classes(self):
        e = error_from_response(404, "sandbox_not_found", "m")
        self.assertTrue(is_hostd_error(e, "sandbox_not_found"))
        self.assertTrue(is_hostd_error(e, "not_found"))
        self.assertTrue(is_hostd_error(e, "hostd_error"))
        self.assertFalse(is_hostd_error(e, "template_not_found"))

    def test_an_unknown_code_takes_the_class_of_its_status_and_keeps_its_code(self):
        e = error_from_response(404, "widget_not_found", "m")
        self.assertIs(type(e), NotFoundError)
        self.assertEqual(e.code, "widget_not_found")
        self.assertIs(type(error_from_response(503, "maintenance", "m")), UnavailableError)


BY_STATUS = [
    (400, InvalidRequestError, "invalid_request"),
    (401, AuthenticationError, "authentication_error"),
    (403, AuthenticationError, "authentication_error"),
    (404, NotFoundError, "not_found"),
    (405, InvalidRequestError, "invalid_request"),
    (410, SandboxLostError, "sandbox_lost"),
    (413, InvalidRequestError, "invalid_request"),
    (415, InvalidRequestError, "invalid_request"),
    (429, RateLimitError, "limit_reached"),
    (500, ExecutorError, "executor_error"),
    (502, UnavailableError, "unavailable"),
    (503, UnavailableError, "unavailable"),
    (507, InsufficientStorageError, "insufficient_storage"),
    (501, HostdError, "hostd_error"),
]


class ByStatusTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)

    def test_every_status_without_a_code_maps_to_its_class(self):
        for status, cls, code in BY_STATUS:
            with self.subTest(status=status):
                self.fake.handler = lambda req, res, s=status: res.error(s, "message for %d" % s)
                with self.assertRaises(cls) as caught:
                    Sandbox.create(base_url=self.fake.url, max_retries=0)
                e = caught.exception
                self.assertIs(type(e), cls)
                self.assertEqual((e.code, e.status, e.message), (code, status, "message for %d" % status))
                self.assertTrue(is_hostd_error(e, code))

    def test_a_coded_answer_keeps_code_status_message_and_retry_after(self):
        self.fake.handler = lambda req, res: res.error(
            503, "template is building", "template_unavailable", {"retry-after": "40"}
        )
        with self.assertRaises(TemplateUnavailableError) as caught:
            Sandbox.create(base_url=self.fake.url)
        e = caught.exception
        self.assertEqual((e.code, e.status, e.retry_after_ms), ("template_unavailable", 503, 40000))

    def test_a_body_that_is_not_json_still_gives_a_readable_message(self):
        self.fake.handler = lambda req, res: res.raw(502, b"<html>Bad Gateway</html>", "text/html")
        with self.assertRaises(UnavailableError) as caught:
            Sandbox.create(base_url=self.fake.url, max_retries=0)
        self.assertEqual(caught.exception.message, "<html>Bad Gateway</html>")

    def test_an_empty_error_body_gives_the_status_line(self):
        self.fake.handler = lambda req, res: res.raw(500, b"")
        with self.assertRaises(ExecutorError) as caught:
            Sandbox.create(base_url=self.fake.url)
        self.assertEqual(caught.exception.message, "HTTP 500 Internal Server Error")

    def test_no_server_is_a_connection_exception(self):
        url = self.fake.url
        self.fake.close()
        with self.assertRaises(ConnectionException) as caught:
            Sandbox.create(base_url=url)
        self.assertEqual(caught.exception.code, "connection_error")
        self.assertIsNone(caught.exception.status)


class IsHostdErrorTest(unittest.TestCase):
    def test_rejects_other_things(self):
        self.assertFalse(is_hostd_error(Exception("x")))
        self.assertFalse(is_hostd_error(None))
        self.assertFalse(is_hostd_error("not_found"))
        e = NotFoundError("gone", 404)
        self.assertTrue(is_hostd_error(e, "not_found"))
        self.assertFalse(is_hostd_error(e, "executor_error"))
        self.assertNotIsInstance(e, ExecutorError)

    def test_recognises_exceptions_from_another_copy_of_the_package(self):
        tmp = tempfile.mkdtemp(prefix="hostd-copy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        target = os.path.join(tmp, "hostd_copy")
        shutil.copytree(os.path.join(SDK_DIR, "hostd"), target, ignore=shutil.ignore_patterns("__pycache__"))
        spec = importlib.util.spec_from_file_location(
            "hostd_copy", os.path.join(target, "__init__.py"), submodule_search_locations=[target]
        )
        copy = importlib.util.module_from_spec(spec)
        sys.modules["hostd_copy"] = copy
        self.addCleanup(sys.modules.pop, "hostd_copy", None)
        spec.loader.exec_module(copy)
        self.assertIsNot(copy.SandboxNotFoundError, SandboxNotFoundError)
        foreign = copy.error_from_response(404, "sandbox_not_found", "sandbox x not found")
        self.assertTrue(is_hostd_error(foreign, "sandbox_not_found"))
        self.assertTrue(is_hostd_error(foreign, "not_found"))
        self.assertFalse(is_hostd_error(foreign, "executor_error"))
        self.assertTrue(copy.is_hostd_error(ExecutorError("vm died"), "executor_error"))
        self.assertEqual(hostd.error_for_status(404, "x").code, "not_found")


if __name__ == "__main__":
    unittest.main()
