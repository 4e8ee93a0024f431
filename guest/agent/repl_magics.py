"""What notebook cells' `!cmd` and `%magic` lines run (docs/api.md, "Notebook mode").

repl_notebook.py turns those lines into calls of this module's functions. The few magics
here are the ones notebook code relies on:

  !cmd, !!cmd, x = !cmd      the shell (bash), its output streamed, or captured as lines
  %cd [-q] [dir|-|~]         change the working directory (printed), as IPython does
  %pwd                       the working directory, as a value
  %env [NAME[=value]]        read or set environment variables
  %pip args                  python3 -m pip args
  %matplotlib [inline]       accepted; figures are always shown inline
  %%bash, %%sh               the cell is a shell script
  %%writefile [-a] path      the cell is written to a file

Any other magic raises UsageError, as IPython does for one it does not know. In commands and
magic arguments, `$name` is replaced by the value of a variable of the cell (left alone when
there is none, so `$HOME` reaches the shell) and `{expression}` by the expression's value; a
command whose expression fails is run as written, as IPython does.
"""

import os
import re
import shlex
import string
import subprocess
import sys

SHELL = "/bin/bash"


class UsageError(Exception):
    """A magic that does not exist or was called wrongly (IPython's name for it)."""


UsageError.__module__ = "builtins"     # shown as "UsageError: ...", as in IPython


class SList(list):
    """The lines a captured command printed: a list, plus IPython's shortcuts to them."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    @property
    def l(self):
        return list(self)


def system(cmd):
    """`!cmd`: runs cmd in bash; its output goes where the cell's goes. Its exit status is in
    the cell's `_exit_code`."""
    frame = sys._getframe(1)
    code = _run(expand(cmd, frame), capture=False)[0]
    frame.f_globals["_exit_code"] = code


def getoutput(cmd):
    """`!!cmd`, `x = !cmd`: what cmd printed (stderr too), as a list of lines."""
    frame = sys._getframe(1)
    code, out = _run(expand(cmd, frame), capture=True)
    frame.f_globals["_exit_code"] = code
    return SList(out.splitlines())


def line_magic(name, args):
    frame = sys._getframe(1)
    handler = _LINE.get(name)
    if handler is None:
        raise UsageError("Line magic function `%%%s` not found." % name)
    return handler(expand(args, frame), frame)


def cell_magic(name, args, body):
    frame = sys._getframe(1)
    handler = _CELL.get(name)
    if handler is None:
        raise UsageError("Cell magic `%%%%%s` not found." % name)
    return handler(expand(args, frame), body, frame)


# ---- running commands ----------------------------------------------------------------------

def _run(cmd, capture, shell=SHELL):
    """Runs cmd; (exit status, captured output or None). The child writes to the worker's own
    fds 1 and 2, which the worker reads: its output is the cell's, in order with print()s."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    options = dict(stdin=subprocess.DEVNULL)
    if capture:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc = subprocess.Popen([shell, "-c", cmd], **options)
    try:
        out, _ = proc.communicate()
    except BaseException:                # a cancel (KeyboardInterrupt): the command goes too
        proc.kill()
        proc.wait()
        raise
    for stream in (sys.stdout, sys.stderr):
        # What the command wrote to fds 1 and 2 goes out now, in order with the prints after it
        take = getattr(getattr(stream, "buffer", None), "take_pipe", None)
        if take is not None:
            take()
    if out is not None:
        out = out.decode("utf-8", "replace")
    return proc.returncode, out


class _Expander(string.Formatter):
    def __init__(self, frame):
        self.frame = frame

    def get_field(self, field_name, args, kwargs):
        return eval(field_name, self.frame.f_globals, self.frame.f_locals), None


_DOLLAR = re.compile(r"\$(\$|[A-Za-z_]\w*)")


def expand(text, frame):
    """IPython's expansion of `$name` and `{expression}` in a command (see the module's doc)."""
    if "$" not in text and "{" not in text:
        return text
    names = dict(frame.f_globals)
    names.update(frame.f_locals)

    def dollar(match):
        word = match.group(1)
        if word == "$":
            return "$"
        return str(names[word]) if word in names else match.group(0)
    try:
        text = _Expander(frame).vformat(text, (), {}) if "{" in text else text
    except Exception:
        return text                      # as IPython: the command is run as written
    return _DOLLAR.sub(dollar, text)


# ---- line magics ---------------------------------------------------------------------------

_previous_dir = []


def _cd(args, frame):
    words = shlex.split(args) if args.strip() else []
    quiet = "-q" in words
    words = [w for w in words if w != "-q"]
    if not words:
        target = os.path.expanduser("~")
    elif words[0] == "-":
        if not _previous_dir:
            raise UsageError("cd -: no previous directory")
        target = _previous_dir[-1]
    else:
        target = os.path.expanduser(" ".join(words))
    try:
        before = os.getcwd()
    except OSError:
        before = None
    try:
        os.chdir(target)
    except OSError as e:
        print(e)                         # IPython prints the reason and goes on
        return None
    if before is not None:
        _previous_dir[:] = [before]
    if not quiet:
        print(os.getcwd())
    return None


def _pwd(args, frame):
    return os.getcwd()


def _env(args, frame):
    args = args.strip()
    if not args:
        return dict(os.environ)
    match = re.match(r"^([^=\s]+)(?:\s*=\s*|\s+)(.*)$", args)
    if match is None:
        if args not in os.environ:
            raise UsageError("Environment does not have key: %s" % args)
        return os.environ[args]
    name, value = match.groups()
    os.environ[name] = value
    print("env: %s=%s" % (name, value))
    return None


def _pip(args, frame):
    code = _run("%s -m pip %s" % (shlex.quote(sys.executable), args), capture=False)[0]
    frame.f_globals["_exit_code"] = code
    return None


def _matplotlib(args, frame):
    return None                          # figures are always shown inline


_LINE = {"cd": _cd, "pwd": _pwd, "env": _env, "pip": _pip, "matplotlib": _matplotlib}


# ---- cell magics ---------------------------------------------------------------------------

def _script(shell):
    def run(args, body, frame):
        frame.f_globals["_exit_code"] = _run(body, capture=False, shell=shell)[0]
        return None
    return run


def _writefile(args, body, frame):
    words = shlex.split(args)
    append = any(w in ("-a", "--append") for w in words)
    paths = [w for w in words if w not in ("-a", "--append")]
    if len(paths) != 1:
        raise UsageError("%%writefile takes one file name (and -a to append)")
    path = os.path.expanduser(paths[0])
    exists = os.path.exists(path)
    print("%s %s" % ("Appending to" if append else "Overwriting" if exists else "Writing",
                     paths[0]))
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(body if body.endswith("\n") or not body else body + "\n")
    return None


_CELL = {"bash": _script("/bin/bash"), "sh": _script("/bin/sh"), "writefile": _writefile}
