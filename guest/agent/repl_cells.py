"""Running one cell like a notebook does (guest/PROTOCOL.md, "Python semantics").

The code is compiled as a module; if its last statement is an expression, that expression is
evaluated separately and its value, if not None, echoed (printed, or displayed as a rich
output). Top-level `await` is allowed: a cell that uses it runs on the worker's persistent
event loop (repl_loop.py).

In notebook mode (docs/api.md, "Notebook mode") the cell is first turned from IPython's syntax
into Python (repl_notebook.py); the value of its last expression is its `result` (unless the
expression ends with `;`, as in IPython), an uncaught exception is an `exception` message
rather than a traceback on stderr, and the figures it leaves open are shown at its end.
"""

import ast
import linecache
import os
import sys
import traceback

from repl_loop import CO_COROUTINE
from repl_magics import UsageError
from repl_notebook import prepare

FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def _compile_expression(src, filename):
    """The code of a one-line cell that is a single expression, else None.

    Same result as the general path below, without its round trip through Python AST objects,
    which costs a one-liner like `print(x)` or `df.head()` ~3x its compile time. Only for one
    line starting at column 0: a failed attempt then costs little, and the general path's
    IndentationError for a leading space stays.
    """
    if "\n" in src.rstrip() or not src[:1].strip():
        return None
    try:
        return compile(src, filename, "eval", FLAGS, dont_inherit=True)
    except SyntaxError:
        return None


def _compile_split(src, filename):
    """(body, last): the code of a cell whose last statement is an expression that starts on the
    cell's last line at column 0 (blank, comment and indented lines after it are the
    expression's own), compiled from the source text itself, split before that line; else None.

    The general path below parses the cell into Python AST objects and compiles those back:
    code (CPython's AST-to-objects and objects-to-AST conversions and its AST validator) that
    nothing else in an exec runs, which every new VM translates anew under TCG for its first
    multi-line cell, ~2,700 guest blocks (~1.5 MiB of its translation buffer;
    docs/architecture.md, "Density"). The split gives the same code objects: the line before
    which it splits starts at column 0, and the lines above compile on their own, so they end
    between two statements (no bracket, string or continuation is left open) and that line
    starts a top-level statement; the lines from there on compile as one expression, so that
    statement is an expression statement and the last one. Line numbers stay those of the cell
    (the expression is compiled after as many newlines), columns too (it starts at column 0).
    Anything else (a compound statement last, an expression after a `;` or whose closing bracket
    is at column 0, a source with a carriage return, whose lines the compiler counts
    differently; a syntax error) goes the general path, which then reports what it reports.
    """
    if "\r" in src:
        return None
    lines = src.split("\n")
    i = len(lines) - 1
    while i >= 0 and (not lines[i][:1].strip() or lines[i][0] == "#"):
        i -= 1                           # the last line that starts at column 0
    if i < 0:
        return None
    try:
        last = compile("\n" * i + "\n".join(lines[i:]), filename, "eval", FLAGS,
                       dont_inherit=True)
        body = compile("\n".join(lines[:i]) + "\n", filename, "exec", FLAGS, dont_inherit=True)
    except Exception:                    # (SyntaxError, ValueError for a NUL, RecursionError)
        return None
    return body, last


class CellRunner:
    """Runs cells. `display` shows their values (repl_display.Display); `loop` runs the cells
    that await."""

    def __init__(self, display, loop, fallback_stderr):
        self.display, self.loop = display, loop
        self.ns = None
        self.fallback_stderr = fallback_stderr   # for a traceback when sys.stderr is broken

    def run(self, src, filename, namespace, notebook=False):
        """Runs one cell in `namespace`; returns its exit code. KeyboardInterrupt (a cancel)
        propagates."""
        self.ns = namespace
        # Registered so that tracebacks and inspect show the source, also from later cells
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        if notebook:
            return self._run_notebook(src, filename)
        try:
            value = self._run(src, filename)
            if value is not None:
                self.display.echo(value)
            return 0
        except SystemExit as e:
            if e.code is None:
                return 0
            if isinstance(e.code, int):
                return e.code
            self._print_stderr(e.code)   # as the interpreter does for sys.exit("message")
            return 1
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            self._print_exception(e)
            return 1

    def _run_notebook(self, src, filename):
        failure = None
        status = 0
        try:
            src = prepare(src)           # one line for one line: the registered source holds
            value = self._run(src, filename, notebook=True)
            if value is not None:
                self.display.result(value)
        except SystemExit as e:
            if e.code is not None and e.code != 0:
                failure = e
                status = e.code if isinstance(e.code, int) else 1
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            failure, status = e, 1
        if failure is not None:
            self._report(failure)
        try:
            self.display.figures.flush()     # as Jupyter's inline backend, even after an error
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            if failure is None:
                self._report(e)
                status = 1
        return status

    def _run(self, src, filename, notebook=False):
        """Runs the cell's code; the value of its last expression (None when there is none, or
        in notebook mode when it ends with ';')."""
        expression = _compile_expression(src, filename)
        if expression is not None:
            return self._evaluate(expression)
        split = _compile_split(src, filename)
        if split is not None:
            body, last = split
        else:
            body, last = self._compile_tree(src, filename, notebook)
        if (body.co_flags | (last.co_flags if last else 0)) & CO_COROUTINE:
            # A cell that awaits anywhere runs on the loop as a whole
            return self.loop.run(self._run_async(body, last))
        eval(body, self.ns)
        return None if last is None else eval(last, self.ns)

    @staticmethod
    def _compile_tree(src, filename, notebook):
        """(body, last) through the cell's AST: the general case."""
        tree = compile(src, filename, "exec", ast.PyCF_ONLY_AST | FLAGS, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            node = tree.body.pop()
            if not (notebook and _ends_with_semicolon(src, node)):
                last = compile(ast.Expression(node.value), filename, "eval", FLAGS,
                               dont_inherit=True)
            else:
                tree.body.append(node)
        return compile(tree, filename, "exec", FLAGS, dont_inherit=True), last

    def _report(self, exc):
        """Notebook mode: an uncaught exception as an `exception` message."""
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        if isinstance(exc, UsageError):  # a magic used wrongly: no frames, as in IPython
            text = "".join(traceback.format_exception_only(type(exc), exc))
        else:
            text = self._format(exc)
        self.display.exception(exc, text)

    def _evaluate(self, code):
        # eval, not exec: code that awaits evaluates to a coroutine, which exec would drop
        value = eval(code, self.ns)
        if code.co_flags & CO_COROUTINE:
            value = self.loop.run(value)
        return value

    async def _run_async(self, body, last):
        """The body, then the last expression's value, on the loop."""
        result = eval(body, self.ns)
        if body.co_flags & CO_COROUTINE:
            await result
        if last is None:
            return None
        value = eval(last, self.ns)
        if last.co_flags & CO_COROUTINE:
            value = await value
        return value

    @staticmethod
    def _format(exc):
        if sys.version_info >= (3, 12):
            sys.last_exc = exc  # pdb.pm() looks here
        try:
            tbe = traceback.TracebackException(type(exc), exc, exc.__traceback__)
            _strip_frames(tbe)
            return "".join(tbe.format())
        except Exception:
            return "".join(traceback.format_exception_only(type(exc), exc))

    def _print_exception(self, exc):
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        text = self._format(exc)
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except Exception:     # user code replaced sys.stderr with something broken
            self.fallback_stderr.write(text)

    @staticmethod
    def _print_stderr(obj):
        try:
            print(obj, file=sys.stderr, flush=True)
        except Exception:
            pass


def _ends_with_semicolon(src, node):
    """Whether the expression statement `node` is followed by ';' on its last line (IPython
    then shows no result: `plt.plot(x, y);`)."""
    lines = src.split("\n")
    if node.end_lineno is None or node.end_lineno > len(lines):
        return False
    line = lines[node.end_lineno - 1].encode("utf-8")   # end_col_offset counts bytes
    rest = line[node.end_col_offset:].decode("utf-8", "replace")
    return rest.split("#", 1)[0].strip().startswith(";")


def _is_own(filename):
    return os.path.dirname(filename) == _OWN_DIR


def _strip_frames(tbe):
    """Removes the worker's frames from a TracebackException and its causes/contexts, and the
    asyncio frames that lead from the worker to an awaiting cell: the user sees their code."""
    asyncio_dir = None
    if "asyncio" in sys.modules:
        asyncio_dir = os.path.dirname(sys.modules["asyncio"].__file__)
    seen, todo = set(), [tbe]
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        frames = [f for f in t.stack if not _is_own(f.filename)]
        while frames and asyncio_dir and os.path.dirname(frames[0].filename) == asyncio_dir:
            del frames[0]
        t.stack = traceback.StackSummary.from_list(frames)
        todo += [t.__cause__, t.__context__] + list(getattr(t, "exceptions", None) or ())
