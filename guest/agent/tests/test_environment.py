"""Environment and working directory: an exec's own `env` and `cwd`, and the sandbox's default
environment (set_env)."""

import os
import unittest

from agent_harness import AgentTestCase

ENV_AND_CWD = "import os\nprint(os.environ.get('A'), os.environ.get('B'), os.getcwd())"


class ExecOptions(AgentTestCase):
    def setUp(self):
        super().setUp()
        self.sub = self.path("sub")
        os.mkdir(self.sub)

    def test_python_env_and_cwd_apply_to_that_cell_only(self):
        result = self.run_ok(ENV_AND_CWD + "\nimport subprocess\n"
                             "_ = subprocess.run(['sh', '-c', 'echo $A; pwd'])",
                             env={"A": "1"}, cwd=self.sub)
        self.assertEqual(result.stdout, ["1 None " + self.sub, "1", self.sub])
        self.assertEqual(self.run_ok(ENV_AND_CWD).stdout, ["None None " + self.workdir])

    def test_python_cells_own_changes_persist_but_not_to_what_the_exec_named(self):
        self.run_ok("import os\nos.environ['A'] = 'cell'\nos.environ['B'] = 'cell'\n"
                    "os.chdir('/')", env={"A": "exec"}, cwd=self.sub)
        self.assertEqual(self.run_ok(ENV_AND_CWD).stdout, ["None cell " + self.workdir])
        self.run_ok("os.environ['A'] = 'before'")
        self.run_ok("os.environ['A'] = 'changed'", env={"A": "exec"})
        self.assertEqual(self.run_ok(ENV_AND_CWD).stdout, ["before cell " + self.workdir])
        self.run_ok("os.chdir('sub')")           # no cwd named: the change persists
        self.assertEqual(self.run_ok("os.getcwd()").stdout, [repr(self.sub)])

    def test_a_python_exec_with_a_missing_cwd_exits_1_without_running(self):
        missing = self.path("missing")
        result = self.agent.run("open('ran', 'w').close()", cwd=missing)
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr, ["hostd: cwd %s: No such file or directory" % missing])
        self.assertFalse(os.path.exists(self.path("ran")))
        self.assertEqual(self.run_ok("import os\nos.getcwd()").stdout, [repr(self.workdir)])

    def test_bash_env_and_cwd_are_its_environment_and_working_directory(self):
        result = self.run_ok("echo $A $HOME; pwd", "bash", env={"A": "1", "HOME": "/h"},
                             cwd=self.sub)
        self.assertEqual(result.stdout, ["1 /h", self.sub])
        self.assertEqual(self.run_ok("echo ${A:-unset} $HOME; pwd", "bash").stdout,
                         ["unset " + self.workdir, self.workdir])

    def test_a_bash_exec_with_a_missing_cwd_exits_1_with_a_stderr_line(self):
        missing = self.path("missing")
        result = self.agent.run("touch %s/ran" % self.workdir, "bash", cwd=missing)
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr, ["hostd: cwd %s: No such file or directory" % missing])
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_display_is_ignored_for_bash(self):
        self.assertEqual(self.run_ok("echo hi", "bash", display=True).stdout, ["hi"])


class SandboxEnvironment(AgentTestCase):
    """set_env: the sandbox's own variables (the create request's `env`), under every exec."""

    def set_env(self, env, nonce="e"):
        reply = self.agent.request({"op": "set_env", "nonce": nonce, "env": env})
        self.assertEqual(reply, {"op": "set_env", "nonce": nonce})

    def test_it_is_the_environment_of_later_bash_execs_and_of_the_repl(self):
        self.run_ok("import os")                 # the worker is up and idle, as in a pool
        self.set_env({"S": "sandbox", "LANG": "C"})
        self.assertEqual(self.run_ok("echo $S $LANG", "bash").stdout, ["sandbox C"])
        self.assertEqual(self.run_ok("os.environ['S'], os.environ['LANG']").stdout,
                         ["('sandbox', 'C')"])
        # An exec's env goes over it, for that exec only
        self.assertEqual(self.run_ok("echo $S", "bash", env={"S": "exec"}).stdout, ["exec"])
        self.assertEqual(self.run_ok("os.environ['S']", env={"S": "exec"}).stdout, ["'exec'"])
        self.assertEqual(self.run_ok("os.environ['S']").stdout, ["'sandbox'"])

    def test_a_second_one_replaces_the_first(self):
        self.set_env({"S": "1", "T": "1"})
        self.set_env({"T": "2"}, "e2")
        self.assertEqual(self.run_ok("echo ${S:-unset} $T", "bash").stdout, ["unset 2"])
        self.assertEqual(self.run_ok("import os\nos.environ.get('S'), os.environ['T']").stdout,
                         ["(None, '2')"])
        self.set_env({}, "e3")                   # and a base variable it had replaced is back
        self.set_env({"LANG": "C"}, "e4")
        self.set_env({}, "e5")
        self.assertEqual(self.run_ok("os.environ['LANG']").stdout, ["'C.UTF-8'"])

    def test_one_no_process_could_be_started_with_changes_nothing(self):
        self.set_env({"S": "1"})
        reply = self.agent.request({"op": "set_env", "nonce": "bad", "env": {"S": "a\0b"}})
        self.assertEqual((reply["op"], reply["nonce"]), ("set_env", "bad"))
        self.assertIsInstance(reply["error"], str)
        self.assertEqual(self.run_ok("echo $S", "bash").stdout, ["1"])
        self.assertEqual(self.agent.run("import os\nos._exit(1)").code, 1)
        self.assertEqual(self.run_ok("import os\nos.environ['S']").stdout, ["'1'"])

    def test_a_fresh_worker_starts_with_it(self):
        self.set_env({"S": "kept"})
        self.assertEqual(self.agent.run("import os\nos._exit(1)").code, 1)
        result = self.agent.run("import os\nos.environ['S']")
        self.assertEqual(result.stdout, ["'kept'"])


if __name__ == "__main__":
    unittest.main()
