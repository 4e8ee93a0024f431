"""Contexts (docs/api.md, "Contexts"): independent Python states in one REPL worker, each with
its own namespace, working directory and execution count, managed by `context` requests on
the REPL port."""

import os
import unittest

from agent_harness import AgentTestCase


class Contexts(AgentTestCase):
    def in_context(self, context, code, **options):
        result = self.agent.run(code, context=context, **options)
        self.assertIsNone(result.rejected, result.events)
        return result

    def value(self, code, context=None):
        result = self.agent.run(code, context=context, notebook=True)
        self.assertEqual(result.code, 0, result.events)
        return result.results[0]["text/plain"] if result.results else None

    def test_the_default_context_is_listed_with_the_workers_directory(self):
        answer = self.agent.context("list")
        self.assertEqual(answer["contexts"], [{"id": "default", "cwd": self.workdir,
                                               "execution_count": 0}])

    def test_a_created_context_has_its_own_namespace(self):
        self.agent.run("x = 1")
        created = self.agent.context("create", context="ctx1", cwd="/")
        self.assertEqual(created["context"], {"id": "ctx1", "cwd": "/", "execution_count": 0})
        result = self.in_context("ctx1", "print(x)")
        self.assertIn("NameError: name 'x' is not defined", result.stderr)
        self.in_context("ctx1", "x = 2")
        self.assertEqual(self.agent.run("print(x)").stdout, ["1"])
        self.assertEqual(self.in_context("ctx1", "print(x)").stdout, ["2"])
        self.assertEqual(self.in_context("default", "print(x)").stdout, ["1"])

    def test_a_context_without_an_id_gets_one_and_the_current_directory(self):
        answer = self.agent.context("create")["context"]
        self.assertRegex(answer["id"], "^[0-9a-f]{16}$")
        self.assertEqual(answer["cwd"], self.workdir)
        ids = [c["id"] for c in self.agent.context("list")["contexts"]]
        self.assertEqual(ids, ["default", answer["id"]])

    def test_each_context_keeps_its_own_working_directory(self):
        os.mkdir(self.path("a"))
        self.agent.context("create", context="c", cwd="/tmp")
        self.assertEqual(self.value("import os; os.chdir(%r); os.getcwd()" % self.path("a"),
                                    "c"), repr(self.path("a")))
        self.assertEqual(self.value("import os; os.getcwd()", "default").strip("'"), self.workdir)
        self.assertEqual(self.value("os.getcwd()", "c"), repr(self.path("a")))
        contexts = self.agent.context("list")["contexts"]
        self.assertEqual([c["cwd"] for c in contexts], [self.workdir, self.path("a")])

    def test_an_execs_own_cwd_applies_to_that_cell_only_within_its_context(self):
        self.agent.context("create", context="c", cwd="/usr")
        result = self.in_context("c", "import os; print(os.getcwd())", cwd="/tmp")
        self.assertEqual(result.stdout, ["/tmp"])
        self.assertEqual(self.in_context("c", "print(os.getcwd())").stdout, ["/usr"])

    def test_main_is_the_contexts_own_module_while_its_cell_runs(self):
        self.agent.context("create", context="c")
        result = self.in_context("c", "import pickle, sys\nclass Point:\n    pass\n"
                                      "p = pickle.loads(pickle.dumps(Point()))\n"
                                      "print(type(p) is Point, sys.modules['__main__'] is "
                                      "sys.modules[__name__])")
        self.assertEqual(result.stdout, ["True True"])
        self.assertEqual(self.agent.run("print('Point' in dir())").stdout, ["False"])

    def test_execution_counts_are_per_context_and_count_notebook_cells(self):
        self.agent.context("create", context="c")
        self.value("1")
        self.value("1")
        self.in_context("c", "1")                           # not a notebook cell
        self.assertEqual(self.agent.run("1", context="c", notebook=True).starts,
                         [{"op": "start", "id": self.agent.next_id - 1, "execution_count": 1}])
        counts = [c["execution_count"] for c in self.agent.context("list")["contexts"]]
        self.assertEqual(counts, [2, 1])

    def test_an_exec_in_a_context_that_does_not_exist_is_rejected_unrun(self):
        result = self.agent.run("open(%r, 'w')" % self.path("ran"), context="nope")
        self.assertEqual((result.code, result.rejected, result.events),
                         (1, "context_not_found", []))
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_a_context_exec_says_it_started(self):
        self.agent.context("create", context="c")
        result = self.in_context("c", "print(1)")
        self.assertEqual(result.events[0], {"op": "start", "id": self.agent.next_id - 1})

    def test_restart_gives_a_fresh_namespace_its_first_directory_and_count(self):
        self.agent.context("create", context="c", cwd="/usr")
        self.value("x = 1\nimport os\nos.chdir('/tmp')\nx", "c")
        answer = self.agent.context("restart", context="c")
        self.assertEqual(answer["context"], {"id": "c", "cwd": "/usr", "execution_count": 0})
        result = self.agent.run("x", context="c", notebook=True)
        self.assertEqual(result.exceptions[0]["value"], "name 'x' is not defined")

    def test_restarting_the_default_context(self):
        self.agent.run("y = 1\nimport os\nos.chdir('/tmp')")
        self.agent.context("restart", context="default")
        result = self.agent.run("import os\nprint(os.getcwd())\nprint(y)")
        self.assertEqual(result.stdout, [self.workdir])
        self.assertIn("NameError: name 'y' is not defined", result.stderr)
        self.assertEqual(self.agent.run("import sys\nprint(sys.modules['__main__'] is "
                                        "sys.modules[__name__])").stdout, ["True"])

    def test_delete(self):
        self.agent.context("create", context="c")
        self.assertEqual(self.agent.context("delete", context="c"),
                         {"op": "context", "id": self.agent.next_id - 1})
        self.assertEqual(self.agent.run("1", context="c").rejected, "context_not_found")
        self.assertEqual(self.agent.context("delete", context="c")["error"],
                         "context_not_found")

    def test_requests_that_cannot_be_served_answer_an_error_code(self):
        self.agent.context("create", context="c")
        for fields, code in ((dict(context="c"), "context_exists"),
                             (dict(context="default"), "context_exists"),
                             (dict(context="bad id"), "invalid_context_id"),
                             (dict(cwd="/no/such/dir"), "invalid_cwd"),
                             (dict(cwd="relative"), "invalid_cwd")):
            self.assertEqual(self.agent.context("create", **fields)["error"], code, fields)
        self.assertEqual(self.agent.context("delete", context="default")["error"],
                         "context_is_default")
        self.assertEqual(self.agent.context("restart", context="nope")["error"],
                         "context_not_found")
        self.assertEqual(self.agent.context("nonsense")["error"], "bad_request")

    def test_a_context_whose_directory_was_removed_says_so(self):
        os.mkdir(self.path("gone"))
        self.agent.context("create", context="c", cwd=self.path("gone"))
        os.rmdir(self.path("gone"))
        result = self.agent.run("print(1)", context="c")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr, ["hostd: context c: cwd %s: No such file or directory"
                                         % self.path("gone")])

    def test_a_fresh_worker_has_the_default_context_only(self):
        self.agent.context("create", context="c")
        self.agent.run("import os; os._exit(3)")
        contexts = self.agent.context("list")["contexts"]
        self.assertEqual([c["id"] for c in contexts], ["default"])


if __name__ == "__main__":
    unittest.main()
