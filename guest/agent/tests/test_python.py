"""Python semantics of the REPL worker (guest/PROTOCOL.md, "Python semantics")."""

import unittest

from agent_harness import AgentTestCase

NO_STDIN = "EOFError: input() is not available: a sandbox exec has no stdin"


class PythonSemantics(AgentTestCase):
    def test_variables_imports_and_open_files_persist(self):
        self.run_ok("import math\nx = 41\nf = open('data.txt', 'w')")
        self.run_ok("f.write(str(x + 1)); f.write(' %.2f' % math.pi); f.close()")
        self.assertEqual(self.run_ok("print(open('data.txt').read())").stdout, ["42 3.14"])

    def test_namespace_is_main_and_cwd_is_workdir(self):
        result = self.run_ok("import os\nprint(__name__)\nprint(os.getcwd())")
        self.assertEqual(result.stdout, ["__main__", self.workdir])

    def test_last_expression_repr_is_printed_like_a_notebook(self):
        self.assertEqual(self.run_ok("x = 20\nx + 22").stdout, ["42"])
        self.assertEqual(self.run_ok("'text'").stdout, ["'text'"])
        self.assertEqual(self.run_ok("None").stdout, [])
        self.assertEqual(self.run_ok("y = 5").stdout, [])
        self.assertEqual(self.run_ok("print('a')\n[1, 2]").stdout, ["a", "[1, 2]"])
        self.assertEqual(self.run_ok("if True:\n    7").stdout, [])   # not a top-level expression
        self.assertEqual(self.run_ok("1; 2").stdout, ["2"])            # the last statement only
        self.assertEqual(self.run_ok("(1 +\n 2)").stdout, ["3"])
        result = self.agent.run("  1")                                   # as in a module
        self.assertEqual((result.code, result.stderr[-1].split(":")[0]), (1, "IndentationError"))

    def test_the_echo_of_the_last_expression_starts_on_a_line_of_its_own(self):
        result = self.run_ok("import sys\nsys.stdout.write('no-newline')\n10")
        self.assertEqual(result.stdout, ["no-newline", "10"])
        result = self.run_ok("import os\nos.write(1, b'raw, no newline')\n11")
        self.assertEqual(result.stdout, ["raw, no newline", "11"])
        result = self.run_ok("print('partial', end='')\nprint('same line')\n12")
        self.assertEqual(result.stdout, ["partialsame line", "12"])

    def test_exception_prints_traceback_without_worker_frames_and_exits_1(self):
        result = self.agent.run("def f():\n    return 1 / 0\nf()")
        self.assertEqual(result.code, 1)
        self.assertTrue(result.stderr[0].startswith("Traceback"), result.stderr)
        self.assertEqual(result.stderr[-1], "ZeroDivisionError: division by zero")
        self.assertIn("    return 1 / 0", result.stderr)          # source lines are shown
        self.assertEqual(frame_files(result.stderr), ["<exec-1>", "<exec-1>"])
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])

    def test_input_prints_its_prompt_then_says_there_is_no_stdin(self):
        result = self.agent.run("name = input('Name: ')")
        self.assertEqual(result.code, 1)
        self.assertEqual([m.get("stream") for m in result.events][0], "stdout")
        self.assertEqual(result.stdout, ["Name: "])
        self.assertEqual(result.stderr[-1], NO_STDIN)
        self.assertEqual(frame_files(result.stderr), ["<exec-1>"])
        result = self.agent.run("try:\n    input()\nexcept EOFError as e:\n    print(e)")
        self.assertEqual(result.stdout, [NO_STDIN.split(": ", 1)[1]])

    def test_large_code_runs(self):
        code = "data = [\n" + "".join("    %d,\n" % i for i in range(30000)) + "]\nsum(data)"
        self.assertGreater(len(code), 200000)
        self.assertEqual(self.run_ok(code).stdout, [str(sum(range(30000)))])

    def test_syntax_error_exits_1(self):
        result = self.agent.run("x = = 1")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr[-1], "SyntaxError: invalid syntax")

    def test_system_exit_sets_the_code_and_the_repl_survives(self):
        self.run_ok("kept = 'yes'")
        self.assertEqual(self.agent.run("import sys; sys.exit(3)").code, 3)
        self.assertEqual(self.agent.run("sys.exit()").code, 0)
        result = self.agent.run("sys.exit('bye')")
        self.assertEqual((result.code, result.stderr), (1, ["bye"]))
        self.assertEqual(self.run_ok("kept").stdout, ["'yes'"])

    def test_raw_fd_and_subprocess_output_is_captured(self):
        result = self.run_ok("import os, subprocess\nos.write(1, b'raw\\n')\n"
                             "subprocess.run(['sh', '-c', 'echo sub; echo suberr >&2'])\n"
                             "None")
        self.assertEqual(result.stdout, ["raw", "sub"])
        self.assertEqual(result.stderr, ["suberr"])

    def test_a_sigint_from_user_code_interrupts_like_in_any_python(self):
        result = self.agent.run("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
                                "import time\ntime.sleep(5)")
        self.assertEqual(result.code, 130)
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])

    def test_the_workers_own_modules_stay_out_of_user_imports(self):
        # sys.path[0] is the working directory, as in the interactive interpreter
        with open(self.path("cells.py"), "w") as f:
            f.write("MINE = True\n")
        self.assertEqual(self.run_ok("import cells\ncells.MINE").stdout, ["True"])


def frame_files(stderr):
    """The file of each frame of a traceback printed on stderr."""
    return [line.split('"')[1] for line in stderr if line.startswith('  File "')]


if __name__ == "__main__":
    unittest.main()
