"""A notebook cell's own syntax, turned into Python (docs/api.md, "Notebook mode").

What IPython accepts and Python does not, as notebook users (and the code models write for
them) type it:

- a cell indented as a whole (copied out of a function, or sent from an indented string):
  the first non-blank line's indentation is removed from every line that has it;
- `!cmd` runs a shell command, `!!cmd` and `name = !cmd` capture its output as a list of lines;
- `%name args` runs a line magic, `name = %name args` keeps its value;
- `%%name args` on the first line runs the whole cell through a cell magic.

Each such line becomes a call into repl_magics, one line for one line, so that tracebacks
point at the lines the user wrote. Only lines that start a statement are touched: a `!` or `%`
inside a string, in brackets or after a backslash is Python's. A line that starts a statement
with `!` or `%` is never valid Python, so valid Python is never changed.
"""

import re

MAGICS = '__import__("repl_magics")'
_MAYBE = re.compile(r"^[ \t]*(?:[!%]|[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*[!%])", re.M)
_ASSIGN = re.compile(r"^([A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*)[ \t]*=[ \t]*([!%])(.*)$")
_NAME = re.compile(r"^%([A-Za-z_]\w*)[ \t]*(.*)$", re.S)


def prepare(src):
    """The Python code of a notebook cell."""
    src = dedent(src)
    cell = _cell_magic(src)
    if cell is not None:
        return cell
    if not _MAYBE.search(src):
        return src                       # the common case: nothing to look at line by line
    return _transform_lines(src)


def dedent(src):
    """IPython's rule: the indentation of the first non-blank line goes from every line that
    starts with it. Blank lines stay, so line numbers do not move."""
    lines = src.split("\n")
    for line in lines:
        if line.strip():
            indent = line[:len(line) - len(line.lstrip(" \t"))]
            break
    else:
        return src
    if not indent:
        return src
    n = len(indent)
    return "\n".join(l[n:] if l.startswith(indent) else l for l in lines)


def _cell_magic(src):
    lines = src.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if not line.startswith("%%"):
            return None
        match = re.match(r"^%%([A-Za-z_]\w*)[ \t]*(.*)$", line)
        if match is None:
            return None
        body = "\n".join(lines[i + 1:])
        call = "%s.cell_magic(%r, %r, %r)" % (MAGICS, match.group(1), match.group(2).rstrip(),
                                              body)
        return "\n" * i + call           # on the line the user wrote it
    return None


def _transform_lines(src):
    out = []
    state = _Scanner()
    for line in src.split("\n"):
        if state.at_statement_start():
            python = _magic_line(line)
            if python is not None:
                out.append(python)
                continue                 # its quotes and brackets are the shell's
        out.append(line)
        state.scan(line)
    return "\n".join(out)


def _magic_line(line):
    stripped = line.lstrip(" \t")
    indent = line[:len(line) - len(stripped)]
    stripped = stripped.rstrip("\r")
    if stripped.startswith("!!"):
        return "%s%s.getoutput(%r)" % (indent, MAGICS, stripped[2:])
    if stripped.startswith("!"):
        return "%s%s.system(%r)" % (indent, MAGICS, stripped[1:])
    if stripped.startswith("%") and not stripped.startswith("%%"):
        call = _line_magic_call(stripped)
        return None if call is None else indent + call
    match = _ASSIGN.match(stripped)
    if match is None:
        return None
    target, kind, rest = match.groups()
    if kind == "!":
        call = "%s.getoutput(%r)" % (MAGICS, rest.lstrip())
    else:
        call = _line_magic_call("%" + rest)
        if call is None:
            return None
    return "%s%s = %s" % (indent, target, call)


def _line_magic_call(text):
    match = _NAME.match(text)
    if match is None:
        return None
    return "%s.line_magic(%r, %r)" % (MAGICS, match.group(1), match.group(2).rstrip())


class _Scanner:
    """Just enough of Python's tokenizer to tell whether the next line starts a statement:
    open brackets, an unterminated (triple-quoted) string, a backslash continuation."""

    def __init__(self):
        self.depth = 0
        self.quote = None
        self.continued = False

    def at_statement_start(self):
        return self.depth == 0 and self.quote is None and not self.continued

    def scan(self, line):
        self.continued = False
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if self.quote is not None:
                if c == "\\":
                    if i == n - 1:
                        self.continued = True    # a string that goes on on the next line
                    i += 2
                elif line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                else:
                    i += 1
                continue
            if c == "#":
                break
            if c in "'\"":
                self.quote = c * 3 if line.startswith(c * 3, i) else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            elif c == "\\" and i == n - 1:
                self.continued = True
            i += 1
        if self.quote in ("'", '"') and not self.continued:
            self.quote = None            # a one-line string cannot go on: Python's error
