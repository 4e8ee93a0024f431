"""Notebook cells and REPL contexts against a scripted fake: the exec options as docs/api.md
names them, run()'s result, error and count, a partial line kept without a newline, and the
context routes with their errors (the TypeScript SDK's test/notebook.test.ts, in Python)."""

import asyncio
import unittest

from _support import SANDBOX_ID, FakeHostd, default_handler

from hostd import (
    AsyncSandbox,
    CellError,
    ContextExistsError,
    ContextNotFoundError,
    InvalidRequestError,
    RunResult,
    Sandbox,
)

CHART = {"type": "bar", "title": None, "elements": []}


def notebook_stream(req, res):
    if not req.path.endswith("/exec"):
        return default_handler(req, res)
    res.start_stream()
    res.event("execution_count", 4, 0)
    res.event("stdout", "ab", 1, partial=True)
    res.event("stdout", "c", 2)
    res.event("display", {"text/plain": "fig", "application/vnd.hostd.chart+json": CHART}, 3)
    res.event("result", {"text/plain": "x", "application/vnd.hostd.dataframe+json": {"a": [1]}}, 4)
    res.event("error", {"name": "E", "value": "v", "traceback": "t"}, 5)
    res.event("exit", 1, 6)
    res.end_stream()


class NotebookTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd()
        self.addCleanup(self.fake.close)
        self.sandbox = Sandbox.connect(SANDBOX_ID, base_url=self.fake.url)

    def check(self, run, results, errors):
        self.assertEqual(
            self.fake.requests[-1].json(),
            {"code": "x", "language": "python", "context": "c1", "notebook": True},
        )
        self.assertEqual(run.stdout, "abc\n")
        self.assertEqual(run.execution_count, 4)
        self.assertEqual(run.result.text, "x")
        self.assertEqual(run.result.dataframe, {"a": [1]})
        self.assertEqual(run.displays[0].chart, CHART)
        self.assertEqual(run.error, CellError("E", "v", "t"))
        self.assertEqual(run.exit_code, 1)
        self.assertEqual((len(results), len(errors)), (1, 1))

    def test_run_sends_context_and_notebook_and_collects_the_result_error_and_count(self):
        self.fake.handler = notebook_stream
        results, errors = [], []
        run = self.sandbox.run(
            "x", context="c1", notebook=True, on_result=results.append, on_error=errors.append
        )
        self.check(run, results, errors)

    def test_the_async_twin_does_the_same(self):
        self.fake.handler = notebook_stream
        results, errors = [], []

        async def main():
            sandbox = AsyncSandbox(SANDBOX_ID, self.sandbox._config)
            return await sandbox.run(
                "x", context="c1", notebook=True, on_result=results.append, on_error=errors.append
            )

        self.check(asyncio.run(main()), results, errors)

    def test_a_plain_run_has_no_notebook_fields(self):
        def plain(req, res):
            if not req.path.endswith("/exec"):
                return default_handler(req, res)
            res.start_stream()
            res.event("exit", 0, 0)
            res.end_stream()

        self.fake.handler = plain
        self.assertEqual(self.sandbox.run("x"), RunResult("", "", 0, []))

    def test_context_calls_use_the_routes_of_docs_api_md(self):
        context = {"id": "c1", "cwd": "/tmp", "execution_count": 0}

        def handler(req, res):
            if req.method == "POST" and req.path.endswith("/contexts"):
                return res.json(200, context)
            if req.method == "GET":
                return res.json(200, {"contexts": [context]})
            if req.path.endswith("/restart"):
                return res.json(200, context)
            return res.empty(204)

        self.fake.handler = handler
        self.assertEqual(self.sandbox.create_context(id="c1", cwd="/tmp"), context)
        self.assertEqual(self.sandbox.list_contexts(), [context])
        self.assertEqual(self.sandbox.restart_context("c1"), context)
        self.sandbox.delete_context("c1")
        base = "/v1/sandboxes/%s/contexts" % SANDBOX_ID
        self.assertEqual(
            [(r.method, r.path) for r in self.fake.requests[-4:]],
            [("POST", base), ("GET", base), ("POST", base + "/c1/restart"), ("DELETE", base + "/c1")],
        )
        self.assertEqual(self.fake.requests[-4].json(), {"id": "c1", "cwd": "/tmp"})

    def test_context_errors_are_their_classes(self):
        def handler(req, res):
            if req.method == "POST":
                return res.error(409, "exists", "context_exists")
            if req.method == "DELETE" and req.path.endswith("/default"):
                return res.error(400, "default", "context_is_default")
            return res.error(404, "no context", "context_not_found")

        self.fake.handler = handler
        with self.assertRaises(ContextExistsError):
            self.sandbox.create_context(id="c1")
        with self.assertRaises(ContextNotFoundError):
            self.sandbox.list_contexts()
        with self.assertRaises(InvalidRequestError):
            self.sandbox.delete_context("default")


if __name__ == "__main__":
    unittest.main()
