"""Configuration and headers: SERVICE_HOSTD_URL, SERVICE_API_KEY, SERVICE_REQUEST_TIMEOUT_S and
SERVICE_MAX_RETRIES with explicit arguments winning, the bearer token, content-type only with a body, the method, path and body of every
call, and the context manager."""

import json
import os
import unittest
from unittest import mock

from _support import FakeHostd, default_handler

from hostd import DEFAULT_BASE_URL, NotFoundException, Sandbox, resolve_config

ID = "sbx_" + "d" * 32
CHILD = "sbx_" + "e" * 32


class ResolveConfigTest(unittest.TestCase):
    def test_defaults(self):
        c = resolve_config(env={})
        self.assertEqual((c.base_url, c.api_key), (DEFAULT_BASE_URL, None))
        self.assertEqual(DEFAULT_BASE_URL, "http://127.0.0.1:7070")

    def test_environment(self):
        c = resolve_config(env={"SERVICE_HOSTD_URL": "http://h:1/", "SERVICE_API_KEY": "k1"})
        self.assertEqual((c.host, c.port, c.prefix, c.api_key), ("h", 1, "", "k1"))

    def test_explicit_arguments_win(self):
        env = {"SERVICE_HOSTD_URL": "http://h:1", "SERVICE_API_KEY": "k1"}
        c = resolve_config(api_key="k2", base_url="https://x.example/api/", env=env)
        self.assertEqual(
            (c.scheme, c.host, c.port, c.prefix, c.api_key), ("https", "x.example", 443, "/api", "k2")
        )
        self.assertIsNone(resolve_config(api_key="", env=env).api_key, "an empty key sends none")

    def test_timeout_and_retries_default_to_60_s_and_3(self):
        c = resolve_config(env={})
        self.assertEqual((c.request_timeout, c.max_retries), (60.0, 3))

    def test_timeout_and_retries_from_the_environment_and_arguments(self):
        env = {"SERVICE_REQUEST_TIMEOUT_S": "2.5", "SERVICE_MAX_RETRIES": "0"}
        c = resolve_config(env=env)
        self.assertEqual((c.request_timeout, c.max_retries), (2.5, 0))
        c = resolve_config(env=env, request_timeout=0, max_retries=5)
        self.assertEqual((c.request_timeout, c.max_retries), (0, 5))
        for bad in ({"SERVICE_REQUEST_TIMEOUT_S": "soon"}, {"SERVICE_REQUEST_TIMEOUT_S": "-1"}, {"SERVICE_MAX_RETRIES": "1.5"}):
            with self.assertRaises(ValueError):
                resolve_config(env=bad)
        with self.assertRaises(ValueError):
            resolve_config(env={}, max_retries=-1)

    def test_empty_variables_are_unset_and_bad_urls_raise(self):
        c = resolve_config(env={"SERVICE_HOSTD_URL": " ", "SERVICE_API_KEY": "", "SERVICE_REQUEST_TIMEOUT_S": "", "SERVICE_MAX_RETRIES": " "})
        self.assertEqual((c.base_url, c.api_key, c.request_timeout, c.max_retries), (DEFAULT_BASE_URL, None, 60.0, 3))
        with self.assertRaises(ValueError):
            resolve_config(base_url="not a url", env={})
        with self.assertRaises(ValueError):
            resolve_config(base_url="ftp://x", env={})


def handler(req, res):
    if req.method == "POST" and req.path == "/v1/sandboxes":
        return res.json(200, {"id": ID, "state": "ready"})
    if req.path.endswith("/fork"):
        return res.json(200, {"parent_id": ID, "children": [{"id": CHILD, "state": "ready"}]})
    if "/merge_into/" in req.path:
        return res.json(200, {"id": ID, "state": "ready", "merged": CHILD})
    if req.method == "GET" and req.path == "/v1/sandboxes":
        return res.json(200, {"sandboxes": []})
    if req.path.endswith("/logs"):
        return res.raw(200, b"console tail\n")
    if req.method == "DELETE":
        return res.empty()
    return default_handler(req, res)


class RequestsTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd(handler)
        self.addCleanup(self.fake.close)

    def test_the_environment_is_used_when_no_arguments_are_given(self):
        with mock.patch.dict(os.environ, {"SERVICE_HOSTD_URL": self.fake.url, "SERVICE_API_KEY": "env-key"}):
            s = Sandbox.create()
            self.assertEqual(s.id, ID)
            req = self.fake.requests[-1]
            self.assertEqual(req.headers["authorization"], "Bearer env-key")
            self.assertEqual(req.headers["content-type"], "application/json")
            self.assertEqual(json.loads(req.body), {})
            Sandbox.create(api_key="explicit")
            self.assertEqual(self.fake.requests[-1].headers["authorization"], "Bearer explicit")
        with mock.patch.dict(os.environ, {"SERVICE_API_KEY": ""}):
            Sandbox.create(base_url=self.fake.url)
            self.assertNotIn("authorization", self.fake.requests[-1].headers)

    def test_every_call_has_the_documented_method_path_and_body(self):
        start = len(self.fake.requests)
        s = Sandbox.create(template="python", base_url=self.fake.url, api_key="k")
        self.assertEqual(Sandbox.connect(ID, base_url=self.fake.url, api_key="k").id, ID)
        self.assertEqual(s.info()["template"], "python")
        children = s.fork(1)
        self.assertEqual([c.id for c in children], [CHILD])
        s.merge(children[0])
        s.merge(CHILD)
        self.assertEqual(Sandbox.list(base_url=self.fake.url, api_key="k"), [])
        self.assertEqual(s.logs(), "console tail\n")
        s.delete()
        seen = [
            (r.method, r.path, r.body.decode(), r.headers.get("content-type"))
            for r in self.fake.requests[start:]
        ]
        self.assertEqual(
            seen,
            [
                ("POST", "/v1/sandboxes", '{"template": "python"}', "application/json"),
                ("GET", "/v1/sandboxes/%s" % ID, "", None),
                ("GET", "/v1/sandboxes/%s" % ID, "", None),
                ("POST", "/v1/sandboxes/%s/fork" % ID, '{"n": 1}', "application/json"),
                ("POST", "/v1/sandboxes/%s/merge_into/%s" % (ID, CHILD), "", None),
                ("POST", "/v1/sandboxes/%s/merge_into/%s" % (ID, CHILD), "", None),
                ("GET", "/v1/sandboxes", "", None),
                ("GET", "/v1/sandboxes/%s/logs" % ID, "", None),
                ("DELETE", "/v1/sandboxes/%s" % ID, "", None),
            ],
        )
        for r in self.fake.requests[start:]:
            self.assertEqual(r.headers["authorization"], "Bearer k")
        self.assertEqual(str(s), ID)

    def test_a_base_url_with_a_path_prefix_keeps_it(self):
        self.fake.handler = lambda req, res: res.json(200, {"id": ID, "state": "ready"})
        Sandbox.create(base_url=self.fake.url + "/prefix/")
        self.assertEqual(self.fake.requests[-1].path, "/prefix/v1/sandboxes")

    def test_the_context_manager_deletes_and_tolerates_an_already_deleted_sandbox(self):
        with Sandbox.create(base_url=self.fake.url) as s:
            self.assertEqual(s.id, ID)
        last = self.fake.requests[-1]
        self.assertEqual((last.method, last.path), ("DELETE", "/v1/sandboxes/%s" % ID))
        self.fake.handler = lambda req, res: (
            res.error(404, "sandbox %s not found" % ID) if req.method == "DELETE" else handler(req, res)
        )
        with Sandbox.create(base_url=self.fake.url):
            pass
        with self.assertRaises(NotFoundException):
            Sandbox.create(base_url=self.fake.url).delete()


if __name__ == "__main__":
    unittest.main()
