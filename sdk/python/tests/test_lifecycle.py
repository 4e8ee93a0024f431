"""The calls of docs/api.md beyond exec, fork and merge, against a fake: create's template,
snapshot, env and allow_out; snapshots (take, list, get, delete); pause and resume; templates;
and the context manager deleting the sandbox, tolerating one already gone."""

import json
import unittest

from _support import FakeHostd

from hostd import (
    ExecutorError,
    Sandbox,
    Snapshot,
    SnapshotNotFoundError,
    Template,
    TemplateNotFoundError,
)

ID = "sbx_" + "4" * 32
SNAP = "snap_" + "5" * 32
SNAPSHOT = {
    "snapshot_id": SNAP,
    "source_sandbox_id": ID,
    "template": "python",
    "size_bytes": 18874368,
    "created_at": "2026-11-23T10:00:00.000Z",
    "sandboxes": 0,
}
TEMPLATE = {
    "name": "python",
    "default": True,
    "state": "ready",
    "error": None,
    "memory_mib": 1024,
    "vcpus": 1,
    "pool_size": 2,
    "disk_mib": 4096,
    "description": "Python with the data stack",
    "preload": ["numpy"],
    "debian_packages": ["python3-numpy"],
    "python_packages": [],
    "image_key": "3f2a",
    "built_at": "2026-11-23T10:00:00Z",
}


def answer(req, res):
    m, p = req.method, req.path
    if m == "POST" and p == "/v1/sandboxes":
        return res.json(200, {"id": ID, "state": "ready"})
    if m == "POST" and p.endswith("/snapshot"):
        return res.json(200, SNAPSHOT)
    if m == "POST" and p.endswith("/pause"):
        return res.json(200, {"id": ID, "state": "paused"})
    if m == "POST" and p.endswith("/timeout"):
        return res.json(200, {"id": ID, "state": "ready", "timeout": 60, "on_timeout": "pause"})
    if m == "POST" and p.endswith("/resume"):
        return res.json(200, {"id": ID, "state": "ready"})
    if m == "GET" and p == "/v1/snapshots":
        return res.json(200, {"snapshots": [SNAPSHOT]})
    if m == "GET" and p == "/v1/snapshots/" + SNAP:
        return res.json(200, SNAPSHOT)
    if m == "GET" and p.startswith("/v1/snapshots/"):
        return res.error(404, "snapshot not found", "snapshot_not_found")
    if m == "GET" and p == "/v1/templates":
        return res.json(200, {"templates": [TEMPLATE]})
    if m == "GET" and p == "/v1/templates/python":
        return res.json(200, TEMPLATE)
    if m == "GET" and p == "/v1/templates/python/log":
        return res.raw(200, b"hostd-build-step: debian packages\n")
    if m == "GET" and p.startswith("/v1/templates/"):
        return res.error(404, "no such template", "template_not_found")
    if m == "DELETE":
        return res.empty()
    return res.error(404, "no route", "route_not_found")


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd(answer)
        self.addCleanup(self.fake.close)

    def seen(self, start):
        return [
            (r.method, r.path, json.loads(r.body) if r.body else None, r.headers.get("content-type"))
            for r in self.fake.requests[start:]
        ]

    def test_create_sends_template_env_and_network_allow_out(self):
        Sandbox.create(
            "python-slim",
            base_url=self.fake.url,
            env={"MODE": "test", "EMPTY": ""},
            allow_out=["pypi.org:443", "*.example.com"],
        )
        Sandbox.create(base_url=self.fake.url, allow_out=[])
        self.assertEqual(
            self.seen(0),
            [
                (
                    "POST",
                    "/v1/sandboxes",
                    {
                        "template": "python-slim",
                        "env": {"MODE": "test", "EMPTY": ""},
                        "network": {"allow_out": ["pypi.org:443", "*.example.com"]},
                    },
                    "application/json",
                ),
                ("POST", "/v1/sandboxes", {"network": {"allow_out": []}}, "application/json"),
            ],
        )

    def test_create_sends_metadata_and_a_lifetime_set_timeout_sets_or_removes_it(self):
        sandbox = Sandbox.create(base_url=self.fake.url, metadata={"run": "7"}, timeout=1.5, on_timeout="pause")
        info = sandbox.set_timeout(60, on_timeout="pause")
        self.assertEqual(info["on_timeout"], "pause")
        sandbox.set_timeout(None)
        self.assertEqual(
            self.seen(0),
            [
                ("POST", "/v1/sandboxes", {"metadata": {"run": "7"}, "timeout": 1.5, "on_timeout": "pause"}, "application/json"),
                ("POST", "/v1/sandboxes/%s/timeout" % ID, {"timeout": 60, "on_timeout": "pause"}, "application/json"),
                ("POST", "/v1/sandboxes/%s/timeout" % ID, {"timeout": None}, "application/json"),
            ],
        )

    def test_snapshot_and_create_from_it_or_its_id(self):
        sandbox = Sandbox.create(base_url=self.fake.url)
        snap = sandbox.snapshot()
        self.assertIsInstance(snap, Snapshot)
        self.assertEqual((snap.id, snap.info, str(snap)), (SNAP, SNAPSHOT, SNAP))
        Sandbox.create(base_url=self.fake.url, snapshot=snap)
        Sandbox.create(base_url=self.fake.url, snapshot=SNAP)
        sandbox.snapshot(name="base:v1")
        self.assertEqual(
            self.seen(0),
            [
                ("POST", "/v1/sandboxes", {}, "application/json"),
                ("POST", "/v1/sandboxes/%s/snapshot" % ID, None, None),
                ("POST", "/v1/sandboxes", {"snapshot": SNAP}, "application/json"),
                ("POST", "/v1/sandboxes", {"snapshot": SNAP}, "application/json"),
                ("POST", "/v1/sandboxes/%s/snapshot" % ID, {"name": "base:v1"}, "application/json"),
            ],
        )

    def test_snapshot_list_get_and_delete(self):
        listed = Snapshot.list(base_url=self.fake.url, api_key="k")
        self.assertEqual([(s.id, s.info) for s in listed], [(SNAP, SNAPSHOT)])
        one = Snapshot.get(SNAP, base_url=self.fake.url, api_key="k")
        one.delete()
        with self.assertRaises(SnapshotNotFoundError):
            Snapshot.get("snap_missing", base_url=self.fake.url, api_key="k")
        self.assertEqual(
            [(m, p) for m, p, _, _ in self.seen(0)],
            [
                ("GET", "/v1/snapshots"),
                ("GET", "/v1/snapshots/" + SNAP),
                ("DELETE", "/v1/snapshots/" + SNAP),
                ("GET", "/v1/snapshots/snap_missing"),
            ],
        )
        self.assertTrue(all(r.headers["authorization"] == "Bearer k" for r in self.fake.requests))

    def test_pause_and_resume_are_bodiless_posts(self):
        sandbox = Sandbox.create(base_url=self.fake.url)
        sandbox.pause()
        sandbox.resume()
        self.assertEqual(
            self.seen(1),
            [("POST", "/v1/sandboxes/%s/pause" % ID, None, None), ("POST", "/v1/sandboxes/%s/resume" % ID, None, None)],
        )

    def test_templates(self):
        self.assertEqual(Template.list(base_url=self.fake.url), [TEMPLATE])
        self.assertEqual(Template.get("python", base_url=self.fake.url), TEMPLATE)
        with self.assertRaises(TemplateNotFoundError):
            Template.get("nope", base_url=self.fake.url)
        self.assertEqual(Template.log("python", base_url=self.fake.url), "hostd-build-step: debian packages\n")
        with self.assertRaises(TemplateNotFoundError):
            Template.log("nope", base_url=self.fake.url)
        self.assertEqual(
            [(m, p) for m, p, _, _ in self.seen(0)],
            [
                ("GET", "/v1/templates"),
                ("GET", "/v1/templates/python"),
                ("GET", "/v1/templates/nope"),
                ("GET", "/v1/templates/python/log"),
                ("GET", "/v1/templates/nope/log"),
            ],
        )

    def test_the_context_manager_tolerates_a_sandbox_already_gone_but_not_other_failures(self):
        self.fake.handler = lambda req, res: (
            res.error(404, "gone", "sandbox_not_found") if req.method == "DELETE" else answer(req, res)
        )
        with Sandbox.create(base_url=self.fake.url):
            pass
        self.fake.handler = lambda req, res: (
            res.error(500, "qemu hung", "executor_error") if req.method == "DELETE" else answer(req, res)
        )
        with self.assertRaises(ExecutorError):
            with Sandbox.create(base_url=self.fake.url):
                pass


if __name__ == "__main__":
    unittest.main()
