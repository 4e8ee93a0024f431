"""What the REPL worker writes on its port: the running exec's output, display bundles, exits.

sys.stdout and sys.stderr write straight into Output (no pipe, no agent); the worker's real
fds 1 and 2 are pipes that its io thread reads, so output of C code and of subprocesses is
captured too. Everything goes through the outbox in the page shared with the agent, so that
what a cell printed before the worker died still reaches the host.
"""

import fcntl
import io
import os
import select
import sys
import threading
import time

from hostd_output_cut import LineCutter, drain_budget
from hostd_wire import encode, wait_writable
from repl_interrupts import raise_deferred_interrupt, state

FLUSH_DELAY = 0.004         # output waits at most this long for more, then goes to the host
FLUSH_BYTES = 64 << 10      # ...or until this much is waiting
FIONREAD = 0x541B           # Linux: bytes waiting in a pipe, asked on either end
CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC


class FlushTimer:
    """The FLUSH_DELAY deadline as a kernel timer (a timerfd, through ctypes: Python 3.11 has no
    os.timerfd_*) that the io thread polls, armed by whichever thread commits the first output.

    Why not wake the io thread to take the deadline: a quick exec (`print(1)`) ends, and flushes
    its output with its exit, long before the deadline, so that wake-up, the GIL hand-off it
    forces with the main thread and the thread's second wake-up at the expired deadline were
    pure cost: under TCG each switch between guest threads is emulated kernel work, several
    per exec (docs/architecture.md, "Exec latency on a slow TCG host"). Arming and disarming a
    timer is one system call each and wakes nobody; the io thread wakes only when a cell is
    still running FLUSH_DELAY after its first unflushed output.
    """

    def __init__(self):
        import ctypes

        class Timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        class Itimerspec(ctypes.Structure):
            _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = fd
        self.armed = False
        self._get_errno = ctypes.get_errno
        self._settime = libc.timerfd_settime
        self._specs = (Itimerspec(), Itimerspec())       # kept alive for the pointers below
        self._specs[0].it_value.tv_nsec = int(FLUSH_DELAY * 1e9)
        self._arm, self._disarm = (ctypes.byref(spec) for spec in self._specs)

    def arm(self):
        """Starts the deadline, FLUSH_DELAY from now."""
        if self._settime(self.fd, 0, self._arm, None) != 0:
            raise OSError(self._get_errno(), "timerfd_settime failed")
        self.armed = True

    def disarm(self):
        """Stops it (and forgets an expiry the io thread has not read yet)."""
        if self.armed:
            self.armed = False
            self._settime(self.fd, 0, self._disarm, None)

    def take(self):
        """The io thread saw the timer expire: reads its count, so that it polls quiet again.
        False if it was set again since (the flush it expired for was done, another armed)."""
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, InterruptedError):
            return False
        self.armed = False
        return True


class Output:
    """Everything the worker sends on its port, in order: `out` and `display` messages of the
    running exec (from sys.stdout / sys.stderr and from the fd 1 / fd 2 pipes), then its exit.

    Messages are held in the shared page's outbox and written together: at the end of the exec
    (one write with its exit), when FLUSH_BYTES are waiting, or FLUSH_DELAY after the first
    (the io thread). One write per quick exec instead of one per line: each costs the guest an
    exit to QEMU. Every method is called with `lock` held; port writes happen under it, so a
    host that stops reading blocks every writer: backpressure, with bounded memory.
    """

    def __init__(self, port_out, shared, pipes, log):
        self.port_out, self.shared, self.log = port_out, shared, log
        self.lock = threading.RLock()     # a signal handler of user code may print
        self.current = 0                 # the exec output is attributed to; 0: discard it
        self.ended = True                # its exit is in the outbox (end())
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
        try:
            self.timer = FlushTimer()    # without it, the io thread is woken to take deadlines
        except (OSError, AttributeError, ImportError) as e:
            log("no timerfd for output flushes, waking the io thread instead: %r" % (e,))
            self.timer = None

    def arm(self, exec_id, mark_partial=False):
        self.current = exec_id
        self.ended = False
        for cutter in self.cutters.values():
            cutter.arm(exec_id, mark_partial)

    def feed(self, name, data):
        if self.current:
            self.cutters[name].feed(data)
            self._commit()

    def message(self, msg):
        """A reply that is not an exec's output (the REPL hello), written at once."""
        self.pending.append(encode(msg))
        self._commit()
        self.flush()

    def insert(self, line):
        """An encoded message of the running exec (a display bundle), after everything the exec
        printed before it: what the pipes hold, and the unfinished last lines of both streams,
        which end there so that what follows starts on a line of its own."""
        if not self.current:
            return
        self.end_lines()
        self.pending.append(line)
        self._commit()

    def end_lines(self):
        """Sends what the exec printed so far, ending the unfinished last line of each stream."""
        self._read_pipes()
        for cutter in self.cutters.values():
            cutter.finish()
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

    def end(self, exec_id, code, rejected=None):
        """The exec is over: what its pipes still hold, its last partial lines, its exit (with
        `rejected`, the code of why it was not run). Once the exit is in the outbox the exec is
        done for the agent (shared.done), even while the write waits for the host: a worker
        that dies then leaves the exit to the agent, which must not add one of its own. Called
        again after a signal handler of user code raised in it, it only finishes the write."""
        if not self.ended:
            self._read_pipes()
            for cutter in self.cutters.values():
                cutter.finish()
            self.current = 0             # (no flush to schedule: it happens now)
            if rejected is None:
                self.pending.append(b'{"op":"exit","id":%d,"code":%d}\n' % (exec_id, code))
            else:
                self.pending.append(encode({"op": "exit", "id": exec_id, "code": code,
                                            "rejected": rejected}))
            self._commit()
            self.ended = True            # (after: an exit twice rather than none)
            self.shared.done = exec_id
        self.flush()

    def _read_pipes(self):
        for fd, _ in self.poller.poll(0):       # one syscall when the pipes are empty
            self.read_pipe(self.names[fd], drain_budget(fd))

    def _commit(self):
        """Moves the cutters' messages into the shared outbox; schedules their flush."""
        if not self.pending:
            return
        outbox = self.shared.outbox
        for msg in self.pending:
            if self.size + len(msg) > len(outbox):
                self.flush()
            if len(msg) > len(outbox):   # a display bundle: in pieces, each flushed
                self._pass_through(msg)
                continue
            outbox[self.size:self.size + len(msg)] = msg
            self.size += len(msg)
        del self.pending[:]
        self.shared.outlen = self.size
        if self.size >= FLUSH_BYTES:
            self.flush()
        elif not self.flush_at and self.current:
            self.flush_at = time.monotonic() + FLUSH_DELAY
            if self.timer is not None:
                try:
                    self.timer.arm()
                    return
                except OSError as e:
                    self.log("output flush timer failed, waking the io thread instead: %s" % e)
                    self.timer = None
            try:
                os.write(self.wake_w, b"\0")    # the io thread takes the deadline
            except BlockingIOError:
                pass

    def _pass_through(self, msg):
        """Writes a message longer than the outbox through it, one outbox-full at a time, so
        that its unwritten part is always in the shared page (take_outbox)."""
        outbox, view = self.shared.outbox, memoryview(msg)
        for start in range(0, len(msg), len(outbox)):
            piece = view[start:start + len(outbox)]
            outbox[:len(piece)] = piece
            self.size = self.shared.outlen = len(piece)
            self.flush()

    def flush(self):
        """Writes the outbox to the port. The outbox and its length in the shared page move
        with every write, so that a signal handler of user code raising in between makes
        nothing go out twice, and a death at most what the last write had just sent (between
        the write's return and the length's update: the agent sends the outbox again)."""
        self.flush_at = 0.0
        outbox = self.shared.outbox
        try:
            while self.size:
                n = self._write(outbox[:self.size])
                rest = self.size - n
                if rest:
                    outbox[:rest] = bytes(outbox[n:self.size])
                self.size = rest
                self.shared.outlen = rest
        finally:
            if self.timer is not None:   # after the write: the exit goes out first
                self.timer.disarm()

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
                    self.log("port write failed: %s" % e)
                self.failed = True
                return len(data)

    def io_thread(self):
        """Reads the fd 1 / fd 2 pipes as they fill, and flushes output left waiting."""
        poller = select.poll()
        for fd in self.names:
            poller.register(fd, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        timer = self.timer
        if timer is not None:
            poller.register(timer.fd, select.POLLIN)
        while True:
            with self.lock:
                flush_at = self.flush_at
                if self.timer is None and timer is not None:   # it failed: back to waking
                    poller.unregister(timer.fd)
                    timer = None
            timeout = None
            if flush_at and timer is None:
                timeout = max(0.0, flush_at - time.monotonic()) * 1000
            events = poller.poll(timeout)
            with self.lock:
                expired = False
                for fd, _ in events:
                    if timer is not None and fd == timer.fd:
                        expired = timer.take()
                    elif fd == self.wake_r:
                        try:
                            os.read(fd, 4096)
                        except BlockingIOError:
                            pass
                    elif not self.read_pipe(self.names[fd], 1 << 20):
                        poller.unregister(fd)    # every writer closed it (user code closed fd 1)
                if self.flush_at and (expired or time.monotonic() >= self.flush_at):
                    self.flush()


class guarded:
    """Holds the output lock for the main thread's user-facing writes. An interrupt that comes
    meanwhile waits until the lock is left (state.in_io), so that it never leaves the outbox
    half-updated; it is raised on the way out."""

    def __init__(self, output):
        self.output = output

    def __enter__(self):
        self.main = threading.get_ident() == state.main_ident
        self.output.lock.acquire()
        if self.main:
            state.in_io = True
        return self.output

    def __exit__(self, *exc):
        if self.main:
            state.in_io = False
        self.output.lock.release()
        if self.main and exc[0] is None:
            raise_deferred_interrupt()


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
        if state.forked:                 # a child of os.fork(): the fds, as in any program
            return os.write(self._fd, data)
        # What `guarded` does, inline: this is every print's path
        out = self._output
        main = threading.get_ident() == state.main_ident
        with out.lock:
            if main:
                state.in_io = True
            try:
                if out.current:
                    if out.pipe_holds_data(self._name):
                        out.read_pipe(self._name, 1 << 20)
                    out.feed(self._name, bytes(data))
            finally:
                if main:
                    state.in_io = False
        if main:
            raise_deferred_interrupt()
        return n

    def take_pipe(self):
        """Sends what the same fd's pipe holds now, before anything written after: a shell
        line's command has exited (repl_magics._run), and its output on this stream must come
        before the cell's next print on the other one, which only drains its own pipe."""
        with guarded(self._output) as out:
            if out.current and out.pipe_holds_data(self._name):
                out.read_pipe(self._name, 1 << 20)


def install_streams(output):
    """Makes sys.stdout and sys.stderr write into `output`."""
    for name, fd, errors in (("stdout", 1, sys.stdout.errors), ("stderr", 2, "backslashreplace")):
        stream = io.TextIOWrapper(_Raw(output, name, fd), encoding="utf-8", errors=errors,
                                  write_through=True)
        setattr(sys, name, stream)


class Notices:
    """The worker's own lines on the exec's stderr ("hostd: ..."), whatever user code did to
    sys.stderr."""

    def __init__(self, output):
        self.output = output

    def write(self, text):
        with self.output.lock:
            self.output.feed("stderr", text.encode("utf-8", "replace"))
