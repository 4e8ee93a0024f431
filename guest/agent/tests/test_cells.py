"""How a cell is compiled (repl_cells.py): the split of a cell whose last statement is an
expression compiles the same code as the general path through the cell's AST, and the cells it
cannot be sure of go that path."""

import unittest
import warnings

import agent_harness  # noqa: F401  (puts the agent's modules on sys.path)
from repl_cells import CellRunner, _compile_split

# Cells whose last statement is an expression starting a line at column 0: split.
SPLIT = [
    "x = 0\nprint(x)",
    "x = 0\nprint(x)\n",
    "x = 0\nx\n\n# a comment\n   # an indented one\n\n",
    "import os\nos.getcwd()  # where we are",
    '"""a docstring"""\nx = 1\nx',
    "def f(a):\n    return a * 2\n\nf(21)",
    "for i in range(3):\n    pass\ni",
    "if True:\n    y = 1\nelse:\n    y = 2\ny + 1",
    "x = [\n    1,\n    2,\n]\nsum(\n    x\n  )",
    "print(1)\n# only comments after",
    "f = lambda: 1\nf()",
    "a = 1\na, a + 1",
    "a = 1\n(b := a + 1)",
    "x = 1\nx if x else -x",
    "import asyncio\nawait asyncio.sleep(0)",
    "x = 1\n1 is 1",
    "s = '''\n# not a comment\n'''\ns",
    "f(\n    1\n  )",
    "x = 1\nf(\n    1)",
    "from __future__ import annotations\nx: int = 1\nx",
    "x = 'é'\nx",
]

# Cells the split leaves to the general path: it cannot tell their last statement from their
# lines alone, or the cell does not compile.
GENERAL = [
    "f(\n1\n)",                           # a closing bracket at column 0
    "x = 0",
    "x = 0\ny = 1",
    "x = 0\n    x",                      # an indented last line
    "for i in range(3):\n    print(i)",
    "x = 1; x",
    "x = 1\nx;",
    "x = (1 +\n2)",
    "x = 1 + \\\n2",
    "s = '''\nabc\n'''",
    "f('''\nfor x in y:\n    pass''')",
    "df = x.groupby(\n    'a'\n).sum()",
    "x = 0\r\nx",
    "x = 1\n*a, b = 1, 2\n*a, b",
    "x = 1\nx = \n2",
    "x =\n1",
    "@decorator\nf",
    "if x:\n    pass\nelse: 1",
    "# only a comment",
    "",
    "x = 1\nx\0",
]


def general(src, notebook=False):
    return CellRunner._compile_tree(src, "<exec-1>", notebook)


class CompileSplit(unittest.TestCase):
    def test_a_split_cell_compiles_to_the_same_code_as_through_its_ast(self):
        for src in SPLIT:
            with self.subTest(src=src), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                split = _compile_split(src, "<exec-1>")
                self.assertIsNotNone(split)
                body, last = general(src)
                # Code objects compare their bytecode, constants, names, line and column
                # table: the same code at the same positions.
                self.assertEqual(split, (body, last))
                self.assertEqual(split[0].co_firstlineno, body.co_firstlineno)

    def test_cells_it_cannot_be_sure_of_go_the_general_path(self):
        for src in GENERAL:
            with self.subTest(src=src):
                self.assertIsNone(_compile_split(src, "<exec-1>"))

    def test_a_split_cell_that_fails_to_compile_raises_what_the_general_path_raises(self):
        for src in ("x = (\nprint(x)", "return 1\nx"):
            with self.subTest(src=src):
                self.assertIsNone(_compile_split(src, "<exec-1>"))
                with self.assertRaises(SyntaxError):
                    general(src)


if __name__ == "__main__":
    unittest.main()
