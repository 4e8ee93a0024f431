"""How output becomes `out` messages: lines, streams, order, streaming, encoding."""

import os
import unittest

from agent_harness import AgentTestCase

# A cell or script that prints a line, then waits for the test to create the file `go`:
# the line can only arrive while the exec runs.
PYTHON_GATED = ("import os, time\nprint('first', flush=True)\n"
                "while not os.path.exists('go'):\n    time.sleep(0.01)\nprint('second')")
BASH_GATED = "echo first; while [ ! -e go ]; do sleep 0.01; done; echo second"


class OutputFraming(AgentTestCase):
    def test_one_event_per_line_and_order_within_each_stream(self):
        result = self.run_ok("import sys\nsys.stdout.write('a\\nb\\nc\\n')\n"
                             "for i in range(50):\n    print(i)\n    print(-i, file=sys.stderr)\n"
                             "None")
        self.assertEqual(result.stdout, ["a", "b", "c"] + [str(i) for i in range(50)])
        self.assertEqual(result.stderr, [str(-i) for i in range(50)])

    def test_stdout_and_stderr_interleave_in_program_order(self):
        result = self.run_ok("import sys, time\nprint('out1')\ntime.sleep(0.05)\n"
                             "print('err1', file=sys.stderr)\ntime.sleep(0.05)\nprint('out2')")
        self.assertEqual([m["data"] for m in result.events], ["out1", "err1", "out2"])
        result = self.run_ok("import sys\nfor i in range(20):\n"
                             "    print('o%d' % i)\n    print('e%d' % i, file=sys.stderr)\n"
                             "raise SystemExit(0)")
        expected = [x for i in range(20) for x in ('o%d' % i, 'e%d' % i)]
        self.assertEqual([m["data"] for m in result.events], expected)

    def test_a_cells_output_is_complete_before_its_exit_even_when_written_last(self):
        # Output still in the pipes when the worker reports the cell done is read first.
        code = ("import os, sys\nsys.stdout.write('x' * 200000 + '\\n')\n"
                "os.write(2, b'raw err last')\nNone")
        for _ in range(5):
            result = self.run_ok(code)
            self.assertEqual(len("".join(result.stdout)), 200000)
            self.assertEqual(result.stderr, ["raw err last"])

    def test_a_cell_that_closes_or_redirects_fd_1_still_ends(self):
        result = self.run_ok("import os\nprint('before', flush=True)\nos.close(1)\nNone")
        self.assertEqual(result.stdout, ["before"])
        result = self.agent.run("import os\nos.dup2(2, 1)\nprint('now on stderr')")
        self.assertEqual(result.code, 0)

    def test_empty_lines_are_kept(self):
        self.assertEqual(self.run_ok("print('a\\n\\nb')").stdout, ["a", "", "b"])

    def test_last_line_without_newline_is_still_sent(self):
        result = self.run_ok("import os\nos.write(1, b'line\\nno newline')\n"
                             "os.write(2, b'err no newline')\nNone")
        self.assertEqual(result.stdout, ["line", "no newline"])
        self.assertEqual(result.stderr, ["err no newline"])
        self.assertEqual(self.run_ok("printf 'a\\nb'", "bash").stdout, ["a", "b"])

    def test_invalid_utf8_is_replaced(self):
        result = self.run_ok("import os\nos.write(1, b'ok \\xff\\xfe \\xc3\\xa9\\n')\nNone")
        self.assertEqual(result.stdout, ["ok \ufffd\ufffd \u00e9"])

    def test_long_line_is_split_on_character_boundaries_and_nothing_is_lost(self):
        # 'é' is 2 bytes and starts at odd offsets: a naive 65536-byte cut would split one
        line = "x" + "\u00e9" * 100000 + "tail"
        result = self.run_ok("print('x' + '\\u00e9' * 100000 + 'tail')\nprint('next')")
        *pieces, after = result.stdout
        self.assertEqual(after, "next")
        self.assertGreater(len(pieces), 1)
        for piece in pieces:
            self.assertLessEqual(len(piece.encode()), 65536)
            self.assertNotIn("\ufffd", piece)
        self.assertEqual("".join(pieces), line)
        # Same through bash, with an exact multiple of 65536 bytes (no spurious empty line)
        result = self.run_ok("head -c 131072 /dev/zero | tr '\\0' y; echo; echo end", "bash")
        self.assertEqual([len(p) for p in result.stdout], [65536, 65536, 3])

    def test_python_lines_stream_while_the_exec_runs(self):
        self.assert_streams(PYTHON_GATED, "python")

    def test_bash_lines_stream_while_the_exec_runs(self):
        self.assert_streams(BASH_GATED, "bash")

    def assert_streams(self, code, language):
        exec_id = self.agent.start(code, language)
        port = self.agent.recv_repl if language == "python" else self.agent.recv
        self.assertEqual(port(), {"op": "out", "id": exec_id, "stream": "stdout",
                                  "data": "first"})
        open(os.path.join(self.workdir, "go"), "w").close()
        result = self.agent.collect(exec_id, language)
        self.assertEqual((result.code, result.stdout), (0, ["second"]))


if __name__ == "__main__":
    unittest.main()
