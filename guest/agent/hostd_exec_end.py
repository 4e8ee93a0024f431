"""How an exec that did not run to its end says so, the same from the bash runner and the REPL
worker (guest/PROTOCOL.md, exec and cancel): its exit code after a cancel, the line of a
timeout, the line of a `cwd` that cannot be used.
"""

TIMED_OUT = "hostd: execution timed out"


def cwd_error(path, error):
    """The stderr line of an exec whose `cwd` cannot be used (it then exits 1 without running)."""
    return "hostd: cwd %s: %s" % (path, error.strerror or error)


def cancel_exit_code(reason):
    """The exit code of an exec cancelled for `reason` (guest/PROTOCOL.md, cancel)."""
    return 124 if reason == "timeout" else 130
