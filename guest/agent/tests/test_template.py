"""The template's settings (/etc/hostd/template.json): preloaded modules and environment, and
preparing a freshly booted template VM for freezing."""

import os
import unittest

from agent_harness import AgentTestCase

# Imported by the worker before it is ready; waits for the test's go-ahead, so that what
# happens before the preload ends can be observed.
GATED_MODULE = """import os, time
while not os.path.exists(os.environ['PRELOAD_GO']):
    time.sleep(0.01)
open(os.environ['PRELOAD_DONE'], 'w').close()
"""


class Preload(AgentTestCase):
    def template(self):
        modules = self.path("modules")
        os.mkdir(modules)
        with open(os.path.join(modules, "gated.py"), "w") as f:
            f.write(GATED_MODULE)
        with open(os.path.join(modules, "broken.py"), "w") as f:
            f.write("raise RuntimeError('broken on purpose')\n")
        return {"name": "test", "preload": ["gated", "no_such_module", "broken", "fractions"],
                "env": {"PYTHONPATH": modules, "PRELOAD_GO": self.path("go"),
                        "PRELOAD_DONE": self.path("done"), "TEMPLATE_VAR": "from template"}}

    def test_prepare_freeze_answers_once_the_preloads_are_done(self):
        self.agent.send({"op": "prepare_freeze", "nonce": "f"})
        self.agent.send({"op": "ping", "nonce": "p"})
        self.assertEqual(self.agent.recv(), {"op": "pong", "nonce": "p"})   # not ready yet
        open(self.path("go"), "w").close()
        self.assertEqual(self.agent.recv(), {"op": "prepare_freeze", "nonce": "f",
                                             "zeroed_bytes": 0})   # --no-system: no zero fill
        self.assertTrue(os.path.exists(self.path("done")))

    def test_preloaded_modules_are_imported_but_not_bound_in_the_namespace(self):
        open(self.path("go"), "w").close()
        result = self.run_ok("import sys\n"
                             "[(m in sys.modules, m in globals()) for m in ('gated', 'fractions')]")
        self.assertEqual(result.stdout, ["[(True, False), (True, False)]"])

    def test_a_module_that_fails_to_import_is_logged_and_skipped(self):
        open(self.path("go"), "w").close()
        result = self.run_ok("import sys\n'broken' in sys.modules, 'fractions' in sys.modules")
        self.assertEqual(result.stdout, ["(False, True)"])
        log = self.agent.log()
        self.assertIn("no_such_module", log)
        self.assertIn("broken", log)

    def test_the_template_env_is_in_every_exec(self):
        open(self.path("go"), "w").close()
        self.assertEqual(self.run_ok("echo $TEMPLATE_VAR", "bash").stdout, ["from template"])
        self.assertEqual(self.run_ok("import os\nos.environ['TEMPLATE_VAR']").stdout,
                         ["'from template'"])


class BrokenTemplateFile(AgentTestCase):
    def template(self):
        return "{not json"

    def test_a_broken_file_means_nothing_to_preload(self):
        self.assertEqual(self.run_ok("print('runs')").stdout, ["runs"])
        self.assertEqual(self.run_ok("echo runs", "bash").stdout, ["runs"])
        self.assertEqual(self.agent.request({"op": "prepare_freeze", "nonce": "f"}),
                         {"op": "prepare_freeze", "nonce": "f", "zeroed_bytes": 0})


class NoTemplateFile(AgentTestCase):
    def test_no_file_means_nothing_to_preload(self):
        self.assertEqual(self.run_ok("import sys\n'fractions' in sys.modules").stdout, ["False"])
        self.assertEqual(self.agent.request({"op": "prepare_freeze", "nonce": "f"}),
                         {"op": "prepare_freeze", "nonce": "f", "zeroed_bytes": 0})


if __name__ == "__main__":
    unittest.main()
