"""hostd Python REPL worker (guest/PROTOCOL.md, "Python semantics").

The worker answers Python execs itself, on its own virtio-serial port (`hostd.repl`): it reads
each exec from the port, runs it in its main thread and writes the output and the exit back.
Under TCG every switch between two guest processes flushes QEMU's soft TLB and jump cache; an
exec that went host -> agent -> worker -> agent -> host cost ~3 ms more than one that stays in
this process. The agent still supervises it, without being on that path: it starts it, forwards
cancels (a message on CMD_FD plus a SIGINT), kills it when it ignores one, and finishes the
exec of a worker that died, from what the worker left in the shared page (hostd_shared.py).

agent.py starts it as
  python3 -u repl_worker.py PORT_IN PORT_OUT CMD_FD SHARED_FD OUT_R ERR_R [NOTICE]
with fds 1 and 2 on pipes whose read ends are OUT_R and ERR_R: output of C extensions and of
subprocesses is read from there by this process's io thread. NOTICE is the exit status of the
worker this one replaces: the first exec says so on stderr.

Host -> worker, on the port: {"op":"hello","nonce":...} (answered with the same nonce; reseeds
`random` before the next cell) and {"op":"exec","id":N,"code":...}.
Agent -> worker, on CMD_FD: {"op":"cancel","id":N,"reason":...,"epoch":E}, read when the shared
page's cancel count moved, or in the SIGINT handler; one whose epoch is not the page's is from
before a hello (a fork child inherits its parent's pipe) and is dropped.
"""

import ast
import builtins
import fcntl
import io
import json
import linecache
import os
import select
import signal
import sys
import threading
import time
import traceback
import types

from hostd_shared import (TIMED_OUT, LineCutter, SharedPage, cancel_exit_code, drain_budget,
                          encode, parse_line, read_lines, wait_writable)

_OWN_FILES = {__file__, os.path.abspath(__file__)}
_INTERRUPTED = 130          # KeyboardInterrupt that no cancel explains (user code raised it)
FLUSH_DELAY = 0.004         # output waits at most this long for more, then goes to the host
FLUSH_BYTES = 64 << 10      # ...or until this much is waiting
FIONREAD = 0x541B           # Linux: bytes waiting in a pipe, asked on either end


def _log(text):
    print("hostd-repl:", text, file=sys.__stderr__, flush=True)


class Output:
    """Everything the worker sends on its port, in order: `out` messages of the running exec
    (from sys.stdout / sys.stderr and from the fd 1 / fd 2 pipes), then its exit.

    Messages are held in the shared page's outbox and written together: at the end of the exec
    (one write with its exit), when FLUSH_BYTES are waiting, or FLUSH_DELAY after the first
    (the io thread). One write per quick exec instead of one per line: each costs the guest an
    exit to QEMU. Every method is called with `lock` held; port writes happen under it, so a
    host that stops reading blocks every writer: backpressure, with bounded memory.
    """

    def __init__(self, port_out, shared, pipes):
        self.port_out, self.shared = port_out, shared
        self.lock = threading.RLock()     # a signal handler of user code may print
        self.current = 0                 # the exec output is attributed to; 0: discard it
        self.pending = []                # messages the cutters just made
        self.size = 0                    # bytes in the shared outbox
        self.flush_at = 0.0              # monotonic deadline of the io thread's flush, or 0
        self.failed = False
        self.cutters = {name: LineCutter(name, self.pending) for name in ("stdout", "stderr")}
        self.pipes = pipes               # {name: read end of that fd's pipe}
        self.names = {fd: name for name, fd in pipes.items()}
        self.poller = select.poll()      # the pipes, for the end of an exec
        for fd in pipes.values():
            os.set_blocking(fd, False)   # read_pipe reads until EAGAIN
            self.poller.register(fd, select.POLLIN)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def arm(self, exec_id):
        self.current = exec_id
        for cutter in self.cutters.values():
            cutter.arm(exec_id)

    def feed(self, name, data):
        if self.current:
            self.cutters[name].feed(data)
            self._commit()

    def message(self, msg):
        self.pending.append(encode(msg))
        self._commit()

    def read_pipe(self, name, budget):
        """Reads what the pipe holds, up to about `budget` bytes; False at EOF."""
        fd = self.pipes[name]
        while budget > 0:
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return True
            if not data:
                return False
            budget -= len(data)
            self.feed(name, data)
        return True

    def pipe_holds_data(self, name):
        n = bytearray(4)
        try:
            fcntl.ioctl(self.pipes[name], FIONREAD, n)
        except OSError:
            return False
        return any(n)

    def end(self, exec_id, code):
        """The exec is over: what its pipes still hold, its last partial lines, its exit."""
        for fd, _ in self.poller.poll(0):       # one syscall when the pipes are empty
            self.read_pipe(self.names[fd], drain_budget(fd))
        for cutter in self.cutters.values():
            cutter.finish()
        self.current = 0                 # (no flush to schedule: it happens now)
        self.pending.append(b'{"op":"exit","id":%d,"code":%d}\n' % (exec_id, code))
        self._commit()
        self.flush()

    def _commit(self):
        """Moves the cutters' messages into the shared outbox; schedules their flush."""
        if not self.pending:
            return
        outbox = self.shared.outbox
        for msg in self.pending:
            if self.size + len(msg) > len(outbox):
                self.flush()
            if len(msg) > len(outbox):   # cannot happen (a message is < 400 KiB); be safe
                continue
            outbox[self.size:self.size + len(msg)] = msg
            self.size += len(msg)
        del self.pending[:]
        self.shared.outlen = self.size
        if self.size >= FLUSH_BYTES:
            self.flush()
        elif not self.flush_at and self.current:
            self.flush_at = time.monotonic() + FLUSH_DELAY
            try:
                os.write(self.wake_w, b"\0")    # the io thread takes the deadline
            except BlockingIOError:
                pass

    def flush(self):
        """Writes the outbox to the port. The outbox and its length in the shared page move
        with every write, so that neither a signal handler of user code raising in between
        nor a death makes anything go out twice."""
        self.flush_at = 0.0
        outbox = self.shared.outbox
        while self.size:
            n = self._write(outbox[:self.size])
            rest = self.size - n
            if rest:
                outbox[:rest] = bytes(outbox[n:self.size])
            self.size = rest
            self.shared.outlen = rest

    def _write(self, data):
        """One write of data to the port; how much went out."""
        while True:
            try:
                return os.write(self.port_out, data)
            except BlockingIOError:
                wait_writable(self.port_out)
            except OSError as e:
                if e.errno is None:      # raised by a signal handler of user code
                    raise
                if not self.failed:      # the host end is gone: what was for it is moot
                    _log("port write failed: %s" % e)
                self.failed = True
                return len(data)

    def io_thread(self):
        """Reads the fd 1 / fd 2 pipes as they fill, and flushes output left waiting."""
        poller = select.poll()
        for fd in self.names:
            poller.register(fd, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            with self.lock:
                flush_at = self.flush_at
            timeout = None if not flush_at else max(0.0, flush_at - time.monotonic()) * 1000
            events = poller.poll(timeout)
            with self.lock:
                for fd, _ in events:
                    if fd == self.wake_r:
                        try:
                            os.read(fd, 4096)
                        except BlockingIOError:
                            pass
                    elif not self.read_pipe(self.names[fd], 1 << 20):
                        poller.unregister(fd)    # every writer closed it (user code closed fd 1)
                if self.flush_at and time.monotonic() >= self.flush_at:
                    self.flush()


class _Raw(io.RawIOBase):
    """The bytes under sys.stdout / sys.stderr: straight into the output, no pipe and no agent.
    Before text goes out, what the same fd's pipe holds goes first (a subprocess's output)."""

    def __init__(self, output, name, fd):
        self._output, self._name, self._fd = output, name, fd

    def writable(self):
        return True

    def fileno(self):
        return self._fd

    def write(self, data):
        n = len(data)
        if _forked:                      # a child of os.fork(): the fds, as in any program
            return os.write(self._fd, data)
        global _in_io
        out = self._output
        main = threading.get_ident() == _main_ident
        with out.lock:
            if main:
                _in_io = True
            try:
                if out.current:
                    if out.pipe_holds_data(self._name):
                        out.read_pipe(self._name, 1 << 20)
                    out.feed(self._name, bytes(data))
            finally:
                if main:
                    _in_io = False
        if main:
            _raise_deferred_interrupt()
        return n


# ---- cancels -------------------------------------------------------------------------------

_running = False            # True while user code runs: only then does SIGINT interrupt
_in_io = False              # inside Output under its lock: an interrupt waits until it is left
_interrupt_deferred = False
_forked = False
_main_ident = threading.get_ident()
_current = 0                # id of the exec being run
_cancels = {}               # exec id -> reason, as the agent sent them
_cmd = None                 # the command pipe's reader


class _Commands:
    def __init__(self, fd, shared):
        self.fd, self.shared = fd, shared
        os.set_blocking(fd, False)
        self.buf = bytearray()
        self.seen = 0                    # the agent made the page for this worker
        self.epoch = shared.epoch

    def read(self, force=False):
        """Reads the agent's cancels if there are new ones; True if any message was read."""
        count = self.shared.cancels
        if count == self.seen and not force:
            return False
        self.seen = count
        got = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            self.buf += data
        epoch = self.shared.epoch
        nl = self.buf.find(b"\n")
        while nl >= 0:
            try:
                msg = json.loads(bytes(self.buf[:nl]))
                if msg.get("epoch") == epoch:        # else from before a hello (a fork)
                    _cancels[int(msg["id"])] = msg.get("reason", "client")
                    got = True
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            del self.buf[:nl + 1]
            nl = self.buf.find(b"\n")
        return got


def _on_sigint(signum, frame):
    # The agent writes a cancel, then signals. A SIGINT for an exec that already ended (the
    # cancel raced with its end) is ignored; one that comes with no cancel at all was sent by
    # user code (os.kill, signal.raise_signal) and interrupts as in any Python program.
    global _interrupt_deferred
    if not _running:
        return
    got = _cmd.read(force=True)
    if _current in _cancels or not got:
        if _in_io:
            _interrupt_deferred = True
        else:
            raise KeyboardInterrupt


def _raise_deferred_interrupt():
    global _interrupt_deferred
    if _interrupt_deferred and _running:
        _interrupt_deferred = False
        raise KeyboardInterrupt


# ---- cells -----------------------------------------------------------------------------------

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
        _stderr.write(text)


def _print_stderr(obj):
    try:
        print(obj, file=sys.stderr, flush=True)
    except Exception:
        pass


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
        return compile(src, filename, "eval", dont_inherit=True)
    except SyntaxError:
        return None


def _run_cell(src, filename, ns):
    """Run one cell like a notebook does. Returns the exit code."""
    # Registered so that tracebacks and inspect show the source, also from later cells
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    try:
        expression = _compile_expression(src, filename)
        if expression is not None:
            value = eval(expression, ns)
            if value is not None:
                sys.displayhook(value)
            return 0
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


class Worker:
    def __init__(self, port_in, output, shared, notice):
        self.port_in, self.output, self.shared = port_in, output, shared
        self.notice = notice             # exit status of the worker this one replaces
        self.reseed = False
        self.main_module = types.ModuleType("__main__")
        self.main_module.__builtins__ = builtins

    def serve(self):
        read_lines(self.port_in, self.handle, _log)

    def handle(self, line):
        try:
            self._handle(line)
        except Exception:                # a bug must not take the REPL down
            _log("internal error:\n" + traceback.format_exc())

    def _handle(self, line):
        msg = parse_line(line) if line.strip() else None
        if msg is None:
            return
        op = msg.get("op")
        if op == "exec":
            exec_id, code = msg.get("id"), msg.get("code")
            if isinstance(exec_id, int) and exec_id > 0 and isinstance(code, str):
                return self.run(exec_id, code)
            return self.reply({"op": "error", "message": "exec needs an id > 0 and a code"})
        if op == "hello":
            # A new connection: the VM may be a restored copy whose `random` state its
            # siblings share. (Exec ids start again too: the agent's epoch covers that.)
            self.reseed = True
            return self.reply({"op": "hello", "nonce": msg.get("nonce"), "pid": os.getpid()})
        self.reply({"op": "error", "message": "unknown op %r on the REPL port" % (op,)})

    def reply(self, msg):
        with self.output.lock:
            self.output.message(msg)
            self.output.flush()

    def run(self, exec_id, code):
        global _running, _current
        out, shared = self.output, self.shared
        _current = exec_id
        shared.taken = exec_id
        with out.lock:
            out.arm(exec_id)
        if shared.epoch != _cmd.epoch:   # a hello came: older cancels are stale
            _cmd.epoch = shared.epoch
            _cancels.clear()
        _cmd.read()
        for old in [i for i in _cancels if i < exec_id]:
            del _cancels[old]
        if self.notice is not None:
            _stderr.write("hostd: the Python REPL exited (code %d); started a fresh one, "
                          "previous state is lost\n" % self.notice)
            self.notice = None
        if self.reseed:
            self.reseed = False
            import random
            random.seed()                # from os.urandom, which the agent has reseeded
        status = _INTERRUPTED
        try:
            try:
                _running = True
                if shared.cancels != _cmd.seen:      # one came since the read above: its
                    _running = False                 # SIGINT may have found _running False
                    _cmd.read()
                    _running = True
                if exec_id not in _cancels:          # a cancel may come before the exec
                    status = _run_cell(code, "<exec-%d>" % exec_id, self.main_module.__dict__)
            finally:
                _running = False
        except KeyboardInterrupt:        # a cancel, or raised by user code
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()           # user code may have replaced them with buffered ones
            except Exception:
                pass
        _cmd.read()
        reason = _cancels.get(exec_id)
        if reason is not None:
            status = cancel_exit_code(reason)
            if reason == "timeout":
                _stderr.write(TIMED_OUT + "\n")
        global _interrupt_deferred
        _interrupt_deferred = False
        for _ in range(3):               # the exit must go out, even if a signal handler of
            try:                         # user code (an alarm) raises in the middle
                with out.lock:
                    out.end(exec_id, status)
                break
            except BaseException:
                pass
        _current = 0
        shared.done = exec_id


class _Stderr:
    """Worker's own notices on the exec's stderr, whatever user code did to sys.stderr."""

    def __init__(self, output):
        self.output = output

    def write(self, text):
        with self.output.lock:
            self.output.feed("stderr", text.encode("utf-8", "replace"))


_stderr = None


def main():
    global _cmd, _stderr
    args = [int(a) for a in sys.argv[1:7]]
    port_in, port_out, cmd_fd, shared_fd, out_r, err_r = args
    notice = int(sys.argv[7]) if len(sys.argv) > 7 else None
    own = set(args)
    for fd in own:
        os.set_inheritable(fd, False)   # subprocesses of user code must not get them
    shared = SharedPage(shared_fd)
    output = Output(port_out, shared, {"stdout": out_r, "stderr": err_r})
    own |= {output.wake_r, output.wake_w}

    def in_child():
        # Nor forked children (multiprocessing): one holding the port would steal the host's
        # messages, and one writing the shared outbox would corrupt this worker's output.
        global _forked, _running
        _forked = True
        _running = False
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in own:
            try:
                os.close(fd)
            except OSError:
                pass
    os.register_at_fork(after_in_child=in_child)
    _cmd = _Commands(cmd_fd, shared)
    _stderr = _Stderr(output)
    worker = Worker(port_in, output, shared, notice)
    # User code runs in a fresh __main__ (a notebook-like namespace); this module stays
    # importable under another name so that its globals stay alive.
    sys.modules["_hostd_repl_worker"] = sys.modules["__main__"]
    sys.modules["__main__"] = worker.main_module
    sys.argv = [""]
    sys.path[0] = ""                    # like the interactive interpreter: import from cwd
    signal.signal(signal.SIGINT, _on_sigint)
    shared.ready = 1
    for name, fd, errors in (("stdout", 1, sys.stdout.errors), ("stderr", 2, "backslashreplace")):
        stream = io.TextIOWrapper(_Raw(output, name, fd), encoding="utf-8", errors=errors,
                                  write_through=True)
        setattr(sys, name, stream)
    threading.Thread(target=output.io_thread, name="hostd-io", daemon=True).start()
    worker.serve()


if __name__ == "__main__":
    main()
