"""Notebook mode (docs/api.md, "Notebook mode"): an exec with `notebook: true` runs as a
Jupyter cell. Its value is a `result`, its exception an `exception`, IPython's `!cmd` and
`%magic` lines work, an indented cell is dedented, and its figures are shown at its end.

matplotlib and pandas are stand-ins (fakes/); the real ones are tested in the `python`
template (test/integration/notebook.test.ts).
"""

import base64
import os
import unittest

from agent_harness import FAKES, AgentTestCase

USE_FAKES = "import sys\nsys.path.insert(0, %r)\n" % FAKES


def b64(data):
    return base64.b64encode(data).decode()


class NotebookCells(AgentTestCase):
    def cell(self, code, **options):
        return self.agent.run(code, notebook=True, **options)

    def ok(self, code, **options):
        result = self.cell(code, **options)
        self.assertEqual(result.code, 0, result.events)
        return result

    def test_the_last_expression_is_the_result_and_is_not_printed(self):
        result = self.ok("x = 1; x")
        self.assertEqual(result.results, [{"text/plain": "1"}])
        self.assertEqual(result.stdout, [])
        self.assertEqual(self.ok("'abc'").results, [{"text/plain": "'abc'"}])

    def test_a_cell_without_a_value_has_no_result(self):
        self.assertEqual(self.ok("y = 2").results, [])
        self.assertEqual(self.ok("None").results, [])
        self.assertEqual(self.ok("print('x')").results, [])

    def test_a_trailing_semicolon_hides_the_result_as_in_ipython(self):
        self.assertEqual(self.ok("1 + 1;").results, [])
        self.assertEqual(self.ok("x = 3\nx ;  # quiet").results, [])
        self.assertEqual(self.ok("'a;b'").results, [{"text/plain": "'a;b'"}])

    def test_the_start_comes_first_with_the_execution_count(self):
        first = self.ok("print('a')")
        second = self.ok("1")
        self.assertEqual(first.events[0], {"op": "start", "id": first.starts[0]["id"],
                                           "execution_count": 1})
        self.assertEqual(second.starts[0]["execution_count"], 2)

    def test_plain_execs_have_no_start_and_are_not_counted(self):
        result = self.agent.run("1 + 1")
        self.assertEqual((result.starts, result.stdout), ([], ["2"]))
        self.assertEqual(self.ok("1").starts[0]["execution_count"], 1)

    def test_output_keeps_its_lines_and_marks_a_line_without_its_newline(self):
        result = self.ok("import sys\nprint('hello')\nsys.stdout.write('ab')\n"
                         "print('x', file=sys.stderr)\nsys.stdout.write('c\\nd')\n"
                         "display(1)\nsys.stdout.write('e' * 70000 + '\\nf')\n")
        outs = [(m["stream"], m["data"][:3], m.get("partial", False))
                for m in result.events if m["op"] == "out"]
        self.assertEqual(outs, [("stdout", "hel", False), ("stderr", "x", False),
                                ("stdout", "abc", False), ("stdout", "d", True),
                                ("stdout", "eee", True), ("stdout", "eee", False),
                                ("stdout", "f", True)])

    def test_an_exception_is_an_exception_message_not_a_stderr_traceback(self):
        result = self.cell("def f():\n    raise ValueError('bad value')\nprint('before')\nf()")
        self.assertEqual(result.code, 1)
        self.assertEqual((result.stdout, result.stderr), (["before"], []))
        [exc] = result.exceptions
        self.assertEqual((exc["name"], exc["value"]), ("ValueError", "bad value"))
        self.assertTrue(exc["traceback"].startswith("Traceback (most recent call last):"))
        self.assertIn("raise ValueError('bad value')", exc["traceback"])
        self.assertTrue(exc["traceback"].endswith("ValueError: bad value\n"))
        self.assertNotIn("repl_", exc["traceback"])      # the worker's frames are not shown

    def test_a_name_error_and_a_syntax_error(self):
        self.assertEqual(self.cell("xyz").exceptions[0]["value"], "name 'xyz' is not defined")
        result = self.cell("1 +")
        self.assertEqual((result.code, result.exceptions[0]["name"]), (1, "SyntaxError"))

    def test_sys_exit_with_a_code_is_an_exception_and_its_code(self):
        result = self.cell("import sys; sys.exit(3)")
        self.assertEqual((result.code, result.exceptions[0]["name"],
                          result.exceptions[0]["value"]), (3, "SystemExit", "3"))
        result = self.cell("import sys; sys.exit(0)")
        self.assertEqual((result.code, result.exceptions), (0, []))

    def test_a_cell_indented_as_a_whole_is_dedented(self):
        result = self.ok("\n        a = 5\n        if a:\n            a *= 2\n\n        a\n"
                         "        ")
        self.assertEqual(result.results, [{"text/plain": "10"}])
        self.assertEqual(self.ok("\tb = 1\n\tb").results, [{"text/plain": "1"}])

    def test_lists_and_dicts_carry_their_json(self):
        result = self.ok("[1, 'a', {'k': None, 2: 1.5}, float('nan')]")
        self.assertEqual(result.results[0]["application/json"],
                         [1, "a", {"k": None, "2": 1.5}, None])
        self.assertNotIn("application/json", self.ok("[object()]").results[0])

    def test_display_and_rich_values_are_on(self):
        result = self.ok("display(1, 'two')\nclass R:\n    def _repr_html_(self):\n"
                         "        return '<b>r</b>'\n    def __repr__(self):\n"
                         "        return 'R()'\nR()")
        self.assertEqual(result.displays, [{"text/plain": "1"}, {"text/plain": "'two'"}])
        self.assertEqual(result.results, [{"text/html": "<b>r</b>", "text/plain": "R()"}])

    def test_a_dataframe_carries_its_columns_as_json(self):
        result = self.ok(USE_FAKES + "import math, pandas as pd\n"
                         "pd.DataFrame([[1, 'a', pd.Timestamp('2020-01-01T00:00:00')],\n"
                         "              [2.5, None, pd.NaT], [math.inf, b'b', object]],\n"
                         "             columns=['n', 's', 7])")
        self.assertEqual(result.results[0]["application/vnd.hostd.dataframe+json"], {
            "n": [1, 2.5, None], "s": ["a", None, "b"],
            "7": ["2020-01-01T00:00:00", None, "<class 'object'>"]})
        self.assertIn("text/html", result.results[0])

    def test_figures_left_open_are_shown_at_the_end_of_the_cell(self):
        result = self.ok(USE_FAKES + "import matplotlib.pyplot as plt\n"
                         "fig, ax = plt.subplots()\nprint('drawn')\n'value'")
        self.assertEqual([m["op"] for m in result.events if m["op"] != "start"],
                         ["out", "result", "display"])
        self.assertEqual(result.displays, [{"image/png": b64(b"PNG of figure 1 as png"),
                                            "text/plain": "<Figure size 640x480 with 1 Axes>"}])
        self.assertEqual(self.ok("plt.get_fignums()").results[0]["text/plain"], "[]")

    def test_figures_are_shown_after_an_error_too(self):
        result = self.cell(USE_FAKES + "import matplotlib.pyplot as plt\n"
                           "fig, ax = plt.subplots()\n1 / 0")
        self.assertEqual([m["op"] for m in result.events if m["op"] != "start"],
                         ["exception", "display"])

    def test_a_shown_figure_is_shown_once(self):
        result = self.ok(USE_FAKES + "import matplotlib.pyplot as plt\n"
                         "fig, ax = plt.subplots()\nplt.show()\n7")
        self.assertEqual([m["op"] for m in result.events if m["op"] != "start"],
                         ["display", "result"])

    def test_plain_execs_keep_their_old_meaning(self):
        result = self.agent.run("print('a')\nxyz")
        self.assertEqual(result.code, 1)
        self.assertEqual((result.results, result.exceptions), ([], []))
        self.assertTrue(result.stderr[-1].startswith("NameError"))
        result = self.agent.run("!ls")
        self.assertEqual(result.code, 1)
        self.assertIn("SyntaxError: invalid syntax", result.stderr)


class ShellAndMagics(AgentTestCase):
    def ok(self, code):
        result = self.agent.run(code, notebook=True)
        self.assertEqual(result.code, 0, result.events)
        return result

    def test_a_shell_line_streams_its_output_in_order_with_prints(self):
        result = self.ok("print('one')\n!echo two; echo three >&2\nprint('four')")
        self.assertEqual([(m["stream"], m["data"]) for m in result.events if m["op"] == "out"],
                         [("stdout", "one"), ("stdout", "two"), ("stderr", "three"),
                          ("stdout", "four")])

    def test_a_shell_lines_stderr_comes_before_the_next_print_on_stdout(self):
        # The print drains only stdout's pipe; the command's stderr must be sent before it
        result = self.ok("for i in range(30):\n    !echo e$i >&2\n    print('o%d' % i)")
        self.assertEqual([m["data"] for m in result.events if m["op"] == "out"],
                         [x for i in range(30) for x in ("e%d" % i, "o%d" % i)])

    def test_a_shell_line_runs_in_the_working_directory_and_sets_exit_code(self):
        result = self.ok("!pwd\n!exit 3\n_exit_code")
        self.assertEqual(result.stdout, [self.workdir])
        self.assertEqual(result.results, [{"text/plain": "3"}])

    def test_captured_output_is_a_list_of_lines(self):
        result = self.ok("files = !printf 'a\\nb\\n'\nfiles, files.n, files.s")
        self.assertEqual(result.results, [{"text/plain": "(['a', 'b'], 'a\\nb', 'a b')"}])
        self.assertEqual(self.ok("!!echo x").results, [{"text/plain": "['x']"}])

    def test_variables_and_expressions_are_expanded_but_shell_variables_are_left(self):
        result = self.ok("name = 'world'\nn = 2\n!echo hello $name {n * 3} $HOME $$ {{x}}")
        home = self.ok("import os\nos.environ['HOME']").results[0]["text/plain"]
        self.assertEqual(result.stdout, ["hello world 6 %s $ {x}" % home.strip("'")])
        result = self.ok("!echo {undefined_name} | awk '{print $1}'")
        self.assertEqual(result.stdout, ["{undefined_name}"])

    def test_magic_lines_in_strings_brackets_and_functions(self):
        result = self.ok('s = """\n!not a command\n%nor this\n"""\n'
                         "t = (1 +\n"
                         "     2)\n"
                         "def f():\n"
                         "    !echo in f\n"
                         "f()\n"
                         "s, t")
        self.assertEqual(result.stdout, ["in f"])
        self.assertEqual(result.results, [{"text/plain": "('\\n!not a command\\n%nor this\\n', 3)"}])

    def test_cd_changes_the_directory_for_later_cells_and_pwd_is_a_value(self):
        os.mkdir(self.path("sub"))
        result = self.ok("%cd sub\n%pwd")
        self.assertEqual(result.stdout, [self.path("sub")])
        self.assertEqual(result.results, [{"text/plain": repr(self.path("sub"))}])
        self.assertEqual(self.ok("import os; os.getcwd()").results,
                         [{"text/plain": repr(self.path("sub"))}])
        self.assertEqual(self.ok("%cd -q -\n%pwd").results, [{"text/plain": repr(self.workdir)}])
        self.assertEqual(self.ok("%cd /no/such/dir").stdout,
                         ["[Errno 2] No such file or directory: '/no/such/dir'"])

    def test_env_reads_and_sets_variables(self):
        result = self.ok("%env HOSTD_X=1\nimport os\nos.environ['HOSTD_X']")
        self.assertEqual((result.stdout, result.results),
                         (["env: HOSTD_X=1"], [{"text/plain": "'1'"}]))
        self.assertEqual(self.ok("%env HOSTD_X").results, [{"text/plain": "'1'"}])
        result = self.agent.run("%env HOSTD_NONE", notebook=True)
        self.assertEqual(result.exceptions[0]["name"], "UsageError")

    def test_an_unknown_magic_is_a_usage_error_without_frames(self):
        result = self.agent.run("%timeit 1", notebook=True)
        [exc] = result.exceptions
        self.assertEqual((result.code, exc["name"], exc["value"]),
                         (1, "UsageError", "Line magic function `%timeit` not found."))
        self.assertEqual(exc["traceback"], "UsageError: Line magic function `%timeit` not found.\n")

    def test_matplotlib_inline_is_accepted(self):
        self.assertEqual(self.ok("%matplotlib inline").events[1:], [])

    def test_a_magic_value_can_be_assigned(self):
        self.assertEqual(self.ok("here = %pwd\nhere").results, [{"text/plain": repr(self.workdir)}])

    def test_bash_and_writefile_cell_magics(self):
        result = self.ok("%%bash\nx=5\necho $((x * 2))\npwd")
        self.assertEqual(result.stdout, ["10", self.workdir])
        result = self.ok("\n%%writefile notes.txt\nline one\nline two")
        self.assertEqual(result.stdout, ["Writing notes.txt"])
        with open(self.path("notes.txt")) as f:
            self.assertEqual(f.read(), "line one\nline two\n")
        self.assertEqual(self.ok("%%writefile -a notes.txt\nthree\n").stdout,
                         ["Appending to notes.txt"])
        with open(self.path("notes.txt")) as f:
            self.assertEqual(f.read(), "line one\nline two\nthree\n")

    def test_a_cancel_ends_a_shell_command(self):
        exec_id = self.agent.start("!sleep 60", notebook=True)
        self.agent.recv_repl()           # its start: the cell runs
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        self.assertEqual(self.agent.collect(exec_id).code, 130)
        self.assertEqual(self.ok("1").results, [{"text/plain": "1"}])


if __name__ == "__main__":
    unittest.main()
