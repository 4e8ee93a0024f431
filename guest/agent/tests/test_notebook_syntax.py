"""A notebook cell's IPython syntax turned into Python (repl_notebook.py), without processes."""

import ast
import unittest

import agent_harness  # noqa: F401  (puts the agent's modules on sys.path)
from repl_notebook import MAGICS, dedent, prepare


class Syntax(unittest.TestCase):
    def test_valid_python_is_never_changed(self):
        for src in ("x = 1\nx", "a = (1 +\n     2)\n", "print('%d' % 3)\nx != 2",
                    "s = '''\n!ls\n%cd x\n'''", "y = 1 \\\n  % 2", "z = [1,\n% 2]"):
            self.assertEqual(prepare(src), src)

    def test_shell_lines(self):
        self.assertEqual(prepare("!ls -l"), "%s.system('ls -l')" % MAGICS)
        self.assertEqual(prepare("  !echo 'it''s'"), "%s.system(\"echo 'it''s'\")" % MAGICS)
        self.assertEqual(prepare("!!date"), "%s.getoutput('date')" % MAGICS)
        self.assertEqual(prepare("files = !ls"), "files = %s.getoutput('ls')" % MAGICS)
        self.assertEqual(prepare("a, b = ! echo x"), "a, b = %s.getoutput('echo x')" % MAGICS)

    def test_magic_lines(self):
        self.assertEqual(prepare("%cd /tmp"), "%s.line_magic('cd', '/tmp')" % MAGICS)
        self.assertEqual(prepare("%pwd"), "%s.line_magic('pwd', '')" % MAGICS)
        self.assertEqual(prepare("here = %pwd"), "here = %s.line_magic('pwd', '')" % MAGICS)

    def test_a_cell_magic_takes_the_whole_cell_on_its_line(self):
        self.assertEqual(prepare("\n%%bash -x\necho 1\n"),
                         "\n%s.cell_magic('bash', '-x', 'echo 1\\n')" % MAGICS)

    def test_only_lines_that_start_a_statement_are_changed(self):
        src = ('!echo "(["\nx = """\n!inside\n"""\ny = (1,\n!2)\nz = 1 \\\n!3\n'
               "t = 'a\\\n!b'\n!last")
        lines = prepare(src).split("\n")
        self.assertEqual([i for i, l in enumerate(lines) if MAGICS in l], [0, 10])
        self.assertEqual(len(lines), len(src.split("\n")))

    def test_lines_stay_where_they_were(self):
        src = "a = 1\n!ls\nb = 2\n%cd x\nc = 3"
        self.assertEqual(len(prepare(src).split("\n")), 5)
        ast.parse(prepare(src))

    def test_dedent_like_ipython(self):
        self.assertEqual(dedent("\n    a = 1\n    if a:\n        b = 2\n\n    b\n    "),
                         "\na = 1\nif a:\n    b = 2\n\nb\n")
        self.assertEqual(dedent("a\n  b"), "a\n  b")
        self.assertEqual(dedent("  a\nb"), "a\nb")
        self.assertEqual(dedent("   "), "   ")


if __name__ == "__main__":
    unittest.main()
