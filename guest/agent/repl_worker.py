"""hostd Python REPL worker (guest/PROTOCOL.md, "Python semantics").

agent.py starts it as `python3 -u repl_worker.py CMD_FD RESULT_FD` with fds 1 and 2 on pipes
that the agent reads, so output of C extensions and subprocesses is captured too. Commands
arrive as JSON lines on CMD_FD:

  {"op": "exec", "id": N, "code": "...", "token": "...", "reseed": true}
                                      run a cell; "reseed" (after a VM restore or fork):
                                      reseed `random` from os.urandom first
  {"op": "cancel", "token": "..."}    sent with a SIGINT; covers a SIGINT that lands
                                      before the cell has started

After each cell the worker flushes sys.stdout and sys.stderr, then writes {"code": N} to
RESULT_FD: everything the cell wrote to fds 1 and 2 is in the pipes by then, and the agent
reads them to the end when the result arrives.
"""

import ast
import builtins
import collections
import fcntl
import json
import linecache
import os
import select
import signal
import sys
import time
import traceback
import types

_OWN_FILES = {__file__, os.path.abspath(__file__)}
_running = False          # True while user code runs: only then does SIGINT interrupt
_cancelled = set()        # tokens of cancelled cells
_INTERRUPTED = 130        # the agent turns this into 124 for a timeout


_FIONREAD = 0x541B           # Linux: bytes waiting in a pipe, asked on either end


class _OrderedStream:
    """sys.stdout / sys.stderr wrapper that keeps the two in order across their two pipes.

    The agent reads fd 1 and fd 2 separately, so when both hold data it cannot tell which came
    first. Before Python code writes to one stream after writing to the other, this waits until
    the agent has drained the other's pipe (at most 50 ms, e.g. while the host is not reading).
    Output a C extension writes straight to the fds is not covered.
    """
    last = None

    def __init__(self, stream, fd):
        self._stream = stream
        self._fd = fd

    def write(self, text):
        other = _OrderedStream.last
        if other is not None and other is not self:
            other._drain()
        _OrderedStream.last = self
        return self._stream.write(text)

    def _drain(self):
        try:
            self._stream.flush()
            pending = bytearray(4)
            deadline = time.monotonic() + 0.05
            while time.monotonic() < deadline:
                fcntl.ioctl(self._fd, _FIONREAD, pending)
                if not any(pending):
                    return
                time.sleep(0.0002)
        except Exception:          # a closed or replaced fd: ordering is best effort then
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _on_sigint(signum, frame):
    # A SIGINT that arrives after the cell finished (the cancel raced with the end) must not
    # break the worker's own bookkeeping nor the next cell: ignore it outside user code.
    if _running:
        raise KeyboardInterrupt


def _write_all(fd, data):
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return True
    except OSError:       # user code closed or broke the fd
        return False


class _Commands:
    """Line reader for the command pipe; cancels are recorded as they are read."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.queue = collections.deque()
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def _feed(self, data):
        self.buf += data
        nl = self.buf.find(b"\n")
        while nl >= 0:
            cmd = json.loads(bytes(self.buf[:nl]))
            del self.buf[:nl + 1]
            if cmd.get("op") == "cancel":
                _cancelled.add(cmd.get("token"))
            else:
                self.queue.append(cmd)
            nl = self.buf.find(b"\n")

    def get(self):
        """Next command, blocking; None when the agent is gone."""
        while not self.queue:
            data = os.read(self.fd, 1 << 20)
            if not data:
                return None
            self._feed(data)
        return self.queue.popleft()

    def poll(self):
        """Read what is already there, without blocking."""
        while self.poller.poll(0):
            data = os.read(self.fd, 1 << 20)
            if not data:
                return
            self._feed(data)


def _strip_own_frames(tbe):
    """Remove this file's frames from a TracebackException and its causes/contexts."""
    seen, todo = set(), [tbe]
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list(
            [f for f in t.stack if f.filename not in _OWN_FILES])
        todo += [t.__cause__, t.__context__] + list(getattr(t, "exceptions", None) or ())


def _print_exception(exc):
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc  # pdb.pm() looks here
    try:
        tbe = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        _strip_own_frames(tbe)
        text = "".join(tbe.format())
    except Exception:
        text = "".join(traceback.format_exception_only(type(exc), exc))
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:     # user code replaced sys.stderr with something broken
        _write_all(2, text.encode("utf-8", "replace"))


def _print_stderr(obj):
    try:
        print(obj, file=sys.stderr, flush=True)
    except Exception:
        pass


def _run_cell(src, filename, ns):
    """Run one cell like a notebook does. Returns the exit code."""
    # Registered so that tracebacks and inspect show the source, also from later cells
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    try:
        tree = compile(src, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec", dont_inherit=True), ns)
        if last is not None:
            value = eval(compile(last, filename, "eval", dont_inherit=True), ns)
            if value is not None:
                sys.displayhook(value)   # prints the repr and sets builtins._
        return 0
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        _print_stderr(e.code)     # as the interpreter does for sys.exit("message")
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        _print_exception(e)
        return 1


def _exec(cmd, ns, commands):
    global _running
    try:
        try:
            _running = True
            # A cancel whose SIGINT arrived before _running was set left its message here
            commands.poll()
            if cmd["token"] in _cancelled:
                raise KeyboardInterrupt
            return _run_cell(cmd["code"], "<exec-%s>" % cmd["id"], ns)
        finally:
            _running = False
    except KeyboardInterrupt:     # a cancel, or raised by user code
        return _INTERRUPTED


def main():
    cmd_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    for fd in (cmd_fd, res_fd):
        os.set_inheritable(fd, False)   # subprocesses of user code must not get them

    def close_in_child():
        # Nor forked children (multiprocessing): one holding the command pipe would keep
        # the agent's writes from failing fast after the worker died.
        for fd in (cmd_fd, res_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    os.register_at_fork(after_in_child=close_in_child)
    # User code runs in a fresh __main__ (a notebook-like namespace); this module stays
    # importable under another name so that its globals stay alive.
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins
    sys.modules["_hostd_repl_worker"] = sys.modules["__main__"]
    sys.modules["__main__"] = main_module
    sys.argv = [""]
    sys.path[0] = ""                    # like the interactive interpreter: import from cwd
    signal.signal(signal.SIGINT, _on_sigint)
    sys.stdout = _OrderedStream(sys.stdout, 1)
    sys.stderr = _OrderedStream(sys.stderr, 2)
    commands = _Commands(cmd_fd)
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        op = cmd.get("op")
        if op == "exec":
            if cmd.get("reseed"):
                import random
                random.seed()             # from os.urandom, which the agent has reseeded
            code = _exec(cmd, main_module.__dict__, commands)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            _cancelled.clear()
            result = json.dumps({"code": code}) + "\n"
            if not _write_all(res_fd, result.encode()):
                return                    # the agent is gone


if __name__ == "__main__":
    main()
