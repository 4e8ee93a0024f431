#!/usr/bin/env python3
"""hostd guest agent: the only process hostd talks to inside a VM.

Speaks the newline-delimited JSON protocol of guest/PROTOCOL.md on the virtio-serial port
named "hostd.agent" (or on stdin/stdout with --stdio, for tests) and runs Python code in a
persistent REPL worker (repl_worker.py) and bash code in fresh processes.
Standard library only; Python 3.9+.

Threads, and why there are three:
  main      reads the channel and handles every host message. It never writes the channel
            itself (but for the hello reply, see on_hello), so a cancel is always acted on,
            even while output is backpressured.
            It hands a Python exec straight to an idle worker (a thread hand-off less).
  executor  one selector loop: starts the other execs, turns the output pipes of the worker
            and of bash into `out` messages, detects the end of each exec. It writes the
            channel synchronously, once per loop round: when the host stops reading, the
            executor blocks, stops reading the pipes, and the producers block on full pipes.
            Memory stays bounded with no queue at all.
  control   writes the main thread's replies (pong, error) so that they never make the
            main thread wait behind backpressured output. (hello is written directly: see
            on_hello.)
(Plus a short-lived timer thread per Python cancel, for the SIGINT -> SIGKILL escalation.)
"""

import argparse
import collections
import errno
import fcntl
import glob
import json
import os
import secrets
import select
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

PORT_NAME = "hostd.agent"
MAX_PIECE = 65536           # at most this many bytes of output per `out` message
PIPE_BUF = 4096             # pipe writes up to this size are atomic (POSIX minimum 512; Linux 4096)
MAX_INPUT_LINE = 4 << 20    # the host never sends more than 1 MiB per line; beyond is garbage
BASH_GRACE = 1.0            # how long background processes may keep bash's pipes open
CANCEL_GRACE = 2.0          # SIGINT -> SIGKILL escalation for the REPL worker
DRAIN_LIMIT = 1 << 20       # bytes read from a pipe beyond what it held (orphans may write forever)
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repl_worker.py")
PYTHON_VERSION = "%d.%d.%d" % sys.version_info[:3]

F_GETPIPE_SZ = 1032         # Linux: a pipe's capacity (user code may have grown it)
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207      # _IO('R', 0x07)


def log(*args):
    print("hostd-agent:", *args, file=sys.stderr, flush=True)


def encode(msg):
    # backslashreplace turns a lone surrogate (e.g. echoed from a nonce) into a valid JSON escape
    text = json.dumps(msg, ensure_ascii=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "backslashreplace")


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def exit_status(returncode):
    """Popen's returncode in shell convention: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def wait_writable(fd):
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    poller.poll()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:          # an fd inherited in non-blocking mode
            wait_writable(fd)


def utf8_cut(buf, start, end):
    """Where to cut buf near `end` (> start) so that no UTF-8 character is split."""
    for cut in range(end, max(start, end - 4), -1):
        if buf[cut] & 0xC0 != 0x80:     # not a continuation byte: a character starts here
            return cut
    return end                          # not UTF-8 anyway; any cut is as good


def exit_notifier(proc):
    """An fd that becomes readable when proc exits: a pidfd, or a pipe closed by a waiter."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # Python < 3.9 or kernel < 5.3
        r, w = os.pipe()

        def wait():
            proc.wait()
            os.close(w)
        threading.Thread(target=wait, daemon=True).start()
        return r


def salvage_hello(line):
    """Find a hello glued behind garbage: a restored VM may hold half a line from the moment
    it was frozen, followed by the host's hello. Returns the hello or None."""
    text = line.decode("utf-8", "replace")
    if '"hello"' not in text:
        return None
    decoder = json.JSONDecoder()
    floor = max(0, len(text) - 4096)    # a hello is small; bounds the work on a huge line
    i = text.rfind("{", floor)
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
            if isinstance(obj, dict) and obj.get("op") == "hello" and not text[end:].strip():
                return obj
        except ValueError:
            pass
        i = text.rfind("{", floor, i)
    return None


class Channel:
    """The write side of the host channel. Output is written synchronously by the executor
    (that is the backpressure point); control replies go through a small writer thread."""

    def __init__(self, wfd):
        self.wfd = wfd
        self._wlock = threading.Lock()
        self._control = collections.deque()
        self._cond = threading.Condition()
        self._blocked_total = 0.0        # seconds spent inside writes so far
        self._write_started = None
        self._failed = False
        threading.Thread(target=self._control_writer, name="control", daemon=True).start()

    def write(self, chunks):
        data = b"".join(chunks)
        with self._wlock:
            self._write_started = time.monotonic()
            try:
                write_all(self.wfd, data)
            except OSError as e:
                if not self._failed:     # host gone or port unplugged: say it once
                    log("channel write failed:", e)
                self._failed = True
            finally:
                self._blocked_total += time.monotonic() - self._write_started
                self._write_started = None

    def blocked_time(self):
        """Seconds spent waiting for the host to read, so far (used by cancel escalation)."""
        started = self._write_started
        return self._blocked_total + (time.monotonic() - started if started is not None else 0.0)

    def send_control(self, msg):
        with self._cond:
            if len(self._control) < 10000:   # a host that floods pings and never reads
                self._control.append(encode(msg))  # loses pongs, not our memory
                self._cond.notify()

    def _control_writer(self):
        while True:
            with self._cond:
                while not self._control:
                    self._cond.wait()
                batch = list(self._control)
                self._control.clear()
            self.write(batch)


class Stream:
    """One output pipe (stdout or stderr) of the worker or of bash, cut into `out` messages:
    one per line, long lines in pieces of at most MAX_PIECE bytes. Messages are appended to
    `outbox`, which the executor writes to the channel after each round of its loop."""

    def __init__(self, fd, name, outbox):
        os.set_blocking(fd, False)
        self.fd, self.name, self.outbox = fd, name, outbox
        self.buf = bytearray()          # the current, incomplete line
        self.prefix = b""
        self.done = True                # True: no exec listens, output is discarded
        self.eof = False

    def arm(self, exec_id):
        """Attribute what is read from now on to exec `exec_id`. The main thread may call
        this while the executor reads the idle pipe: `done` is set last, so the executor
        feeds nothing before prefix and buffer are in place."""
        self.prefix = ('{"op":"out","id":%d,"stream":"%s","data":' % (exec_id, self.name)).encode()
        del self.buf[:]
        self.done = self.eof

    def pump(self):
        """Read what is there (one read); False at EOF."""
        try:
            data = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return True
        if not data:
            self.eof = True
            self.finish()
            return False
        if not self.done:
            self._feed(data)
        return True

    def drain(self):
        """Read what is there without blocking: the end of a cell's output (the worker wrote
        it before its result), or what a dead writer left. All that the pipe holds, plus at
        most DRAIN_LIMIT more (orphans may write forever)."""
        try:
            budget = fcntl.fcntl(self.fd, F_GETPIPE_SZ) + DRAIN_LIMIT
        except OSError:
            budget = DRAIN_LIMIT
        while budget > 0 and not self.eof:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                self.eof = True
                return
            budget -= len(data)
            if not self.done:
                self._feed(data)

    def finish(self):
        """The exec is over for this stream: send the last partial line, stop listening."""
        if not self.done:
            self._cut(final=True)
            self.done = True

    def _feed(self, data):
        self.buf += data
        self._cut(final=False)

    def _cut(self, final):
        buf, msgs = self.buf, self.outbox
        pos = 0
        nl = buf.find(b"\n")
        while nl >= 0:
            self._line(buf, pos, nl)
            pos = nl + 1
            nl = buf.find(b"\n", pos)
        if final:
            if pos < len(buf):
                self._line(buf, pos, len(buf))
            pos = len(buf)
        else:
            # A line longer than MAX_PIECE is sent as it arrives (never buffered whole). What
            # is held back is never empty after a piece went out, so no spurious empty line
            # can follow.
            while len(buf) - pos > MAX_PIECE:
                cut = utf8_cut(buf, pos, pos + MAX_PIECE)
                msgs.append(self._msg(buf[pos:cut]))
                pos = cut
        del buf[:pos]

    def _line(self, buf, start, end):
        while end - start > MAX_PIECE:
            cut = utf8_cut(buf, start, start + MAX_PIECE)
            self.outbox.append(self._msg(buf[start:cut]))
            start = cut
        self.outbox.append(self._msg(buf[start:end]))

    def _msg(self, piece):
        data = json.dumps(piece.decode("utf-8", "replace"), ensure_ascii=False)
        return self.prefix + data.encode("utf-8") + b"}\n"


SANDBOX_CGROUP = "/sys/fs/cgroup/sandbox"


class Cgroups:
    """Puts user code in cgroup v2 groups under `sandbox`, which /init caps on processes and
    memory, so that a fork bomb or a memory hog runs into its own limits (the OOM killer picks
    within the group) and never starves the agent. Each bash exec gets its own group, so a
    cancel kills everything it started, even processes that left its process group.
    Disabled (all no-ops) when /init did not create the group, e.g. in tests on a host."""

    def __init__(self, enabled):
        self.enabled = enabled and os.path.isdir(SANDBOX_CGROUP)
        if self.enabled:
            self.make("repl")

    def make(self, name):
        if self.enabled:
            try:
                os.mkdir(os.path.join(SANDBOX_CGROUP, name))
            except FileExistsError:
                pass
            except OSError as e:
                log("cannot create cgroup %s: %s" % (name, e))

    def joiner(self, name):
        """A preexec_fn moving the new process into group `name` before it runs anything.
        It only calls os.open/os.write: safe between fork and exec in a threaded process."""
        if not self.enabled:
            return None
        path = os.path.join(SANDBOX_CGROUP, name, "cgroup.procs").encode()

        def join():
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError:
                pass
        return join

    def kill(self, name):
        if self.enabled:
            try:
                with open(os.path.join(SANDBOX_CGROUP, name, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass

    def sweep(self, keep):
        """Removes exec groups whose processes have all exited (rmdir fails while busy)."""
        if not self.enabled:
            return
        for path in glob.glob(os.path.join(SANDBOX_CGROUP, "exec-*")):
            if os.path.basename(path) != keep:
                try:
                    os.rmdir(path)
                except OSError:
                    pass


class Worker:
    """The REPL worker process and the agent's ends of its pipes."""

    def __init__(self, workdir, env, outbox, preexec=None):
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", WORKER_SCRIPT, str(cmd_r), str(res_w)],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, pass_fds=(cmd_r, res_w),
                cwd=workdir, env=env, start_new_session=True,   # own group: killpg on escalation
                preexec_fn=preexec)
        except BaseException:
            for fd in (self.cmd_w, self.res_r, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (cmd_r, res_w, out_w, err_w):
                os.close(fd)
        os.set_blocking(self.res_r, False)
        os.set_blocking(self.cmd_w, False)   # see send()
        self.res_buf = bytearray()
        self.out = Stream(out_r, "stdout", outbox)
        self.err = Stream(err_r, "stderr", outbox)
        self.exit_fd = exit_notifier(self.proc)
        self.cmd_lock = threading.Lock()   # the executor and the main thread both send commands

    def send(self, data, wait):
        """Write an encoded command; raises OSError if the worker is gone. The main thread
        passes wait=False: it must never block on the worker (a worker whose main thread is
        stuck would then also stop cancels), so it only sends up to PIPE_BUF bytes, which a
        pipe takes whole or not at all, and gets False when the pipe is full or busy."""
        if not self.cmd_lock.acquire(wait):
            return False
        try:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.cmd_w, view):]
                except BlockingIOError:
                    if not wait:
                        return False
                    wait_writable(self.cmd_w)
            return True
        finally:
            self.cmd_lock.release()

    def fds(self):
        return (self.out.fd, self.err.fd, self.res_r, self.exit_fd)

    def close(self):
        for fd in self.fds() + (self.cmd_w,):
            os.close(fd)


class Exec:
    def __init__(self, exec_id, language, code):
        self.id, self.language, self.code = exec_id, language, code
        # Per-exec secret: the key of a cancel
        self.token = "hostd-cancel-%s" % secrets.token_hex(16)
        self.cancel_reason = None   # set under Agent.lock
        self.signalled = False      # the cancel reached the worker / bash
        self.cancel_clock = None    # (monotonic, channel.blocked_time()) when signalled
        self.worker = None          # python: the worker the exec was sent to
        self.result = None          # python: the worker's result message
        self.proc = None            # bash
        self.streams = ()           # bash
        self.exit_fd = None         # bash
        self.status = None          # bash: exit status once reaped
        self.deadline = None        # monotonic time at which the executor stops waiting


class Agent:
    def __init__(self, channel, workdir, system):
        self.channel = channel
        self.workdir = workdir
        self.system = system
        self.cgroups = Cgroups(system)
        # HOME is the work directory (PROTOCOL.md: /root, which is the default workdir)
        self.env = {"HOME": workdir, "LANG": "C.UTF-8",
                    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        # Guards what the main thread shares with the executor: current, pending, worker
        # (and the worker's command fd, which is closed only under it).
        self.lock = threading.Lock()
        self.current = None
        self.pending = collections.deque()
        self.worker = None
        self.worker_died = None     # exit status of a dead worker, announced by the next exec
        self.reseed_worker = False  # a hello came: the next exec reseeds `random` first
        self.outbox = []            # executor: encoded messages of the current loop round
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_wake)
        threading.Thread(target=self._executor, name="executor", daemon=True).start()

    # ---- main thread: host messages -------------------------------------------------------

    def serve(self, rfd, stdio):
        buf = bytearray()
        skipping = False                 # inside an oversized line: drop up to its newline
        while True:
            try:
                data = os.read(rfd, 65536)
            except OSError as e:
                if stdio:
                    break
                log("channel read failed:", e)
                time.sleep(0.1)
                continue
            if not data:
                if stdio:
                    break
                # The host end of the port is closed: reads return EOF at once until it
                # reconnects, and a reconnection starts with a fresh hello.
                del buf[:]
                time.sleep(0.05)
                continue
            start = len(buf)
            buf += data
            pos = 0
            nl = buf.find(b"\n", start)
            while nl >= 0:
                if not skipping:
                    try:
                        self.handle_line(bytes(buf[pos:nl]))
                    except Exception as e:   # a bug must not take the agent down
                        log("internal error:\n" + traceback.format_exc())
                        self.error("internal error: %s" % e)
                skipping = False
                pos = nl + 1
                nl = buf.find(b"\n", pos)
            del buf[:pos]
            if len(buf) > MAX_INPUT_LINE:
                if not skipping:
                    self.error("line longer than %d bytes dropped" % MAX_INPUT_LINE)
                skipping = True
                del buf[:]
        self.shutdown()

    def handle_line(self, line):
        if not line.strip():
            return
        try:
            msg = json.loads(line)
        except ValueError as e:
            msg = salvage_hello(line)
            if msg is None:
                return self.error("malformed JSON: %s" % e)
        if not isinstance(msg, dict):
            return self.error("a message must be a JSON object")
        handler = {"hello": self.on_hello, "exec": self.on_exec,
                   "cancel": self.on_cancel, "ping": self.on_ping}.get(msg.get("op"))
        if handler is None:
            return self.error("unknown op %r" % (msg.get("op"),))
        handler(msg)

    def error(self, message):
        self.channel.send_control({"op": "error", "message": message})

    def on_ping(self, msg):
        self.channel.send_control({"op": "pong", "nonce": msg.get("nonce")})

    def on_hello(self, msg):
        nonce = msg.get("nonce")
        if not isinstance(nonce, str):
            return self.error("hello: nonce must be a string")
        if self.system:
            self.set_clock(msg.get("time_ns"))
            self.reseed_kernel(msg.get("seed"))
        with self.lock:
            # The worker reseeds `random` (from the kernel, reseeded above) before the next
            # cell runs: riding on the exec command, the request can neither be lost nor
            # make this thread wait for the worker.
            self.reseed_worker = True
        # Written from this thread, not through the control writer: a hello comes right after a
        # restore, when nothing else writes and the host reads, and under TCG every first run
        # of code is translated anew in each restored VM: a thread hand-off costs a fork child
        # ~10 ms of CPU before it can answer.
        self.channel.write([encode({"op": "hello", "nonce": nonce, "pid": os.getpid(),
                                    "python": PYTHON_VERSION})])

    @staticmethod
    def set_clock(time_ns):
        # hostd sends time_ns as a decimal string (a JS BigInt); PROTOCOL.md says int
        try:
            time.clock_settime_ns(time.CLOCK_REALTIME, int(time_ns))
        except (TypeError, ValueError, OSError) as e:
            log("cannot set the clock:", e)

    _urandom_fd = None

    @classmethod
    def reseed_kernel(cls, seed):
        try:
            raw = bytes.fromhex(seed)
            # Opened once, before the template is frozen, so a restore does not walk the path
            # again (first runs of kernel code are what a restore pays for under TCG).
            if cls._urandom_fd is None:
                cls._urandom_fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
            fd = cls._urandom_fd
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(raw) * 8, len(raw)) + raw)
            fcntl.ioctl(fd, RNDRESEEDCRNG)
        except (TypeError, ValueError, OSError) as e:
            log("cannot reseed the kernel RNG:", e)

    def on_exec(self, msg):
        exec_id, language, code = msg.get("id"), msg.get("language"), msg.get("code")
        if not is_int(exec_id) or language not in ("python", "bash") or not isinstance(code, str):
            return self.error("exec needs an int id, language python|bash and a string code")
        ex = Exec(exec_id, language, code)
        with self.lock:
            # Fast path: the usual case, a small Python exec for an idle, live worker, is
            # sent to the worker from here. Anything else (bash, big code, a worker to
            # (re)start, an exec while another runs: the host serializes, but if it does not
            # they queue) is left to the executor.
            w = self.worker
            if (language == "python" and self.current is None and not self.pending
                    and w is not None and self.worker_died is None and w.proc.poll() is None):
                command = self._arm_python(ex, w)
                # Current before the write: the executor reads `current` without the lock
                # when the worker's result comes back
                ex.worker, self.current = w, ex
                try:
                    sent = len(command) <= PIPE_BUF and w.send(command, wait=False)
                except OSError:
                    sent = True          # it just died: _on_worker_exit ends the exec
                if sent:
                    self.reseed_worker = False
                    return
                ex.worker, self.current = None, None   # nothing was written: queue it
            self.pending.append(ex)
        self._wake()

    def on_cancel(self, msg):
        exec_id, reason = msg.get("id"), msg.get("reason", "client")
        if not is_int(exec_id) or reason not in ("timeout", "client", "shutdown"):
            return self.error("cancel needs an int id and reason timeout|client|shutdown")
        with self.lock:
            ex = self.current
            if ex is not None and ex.id == exec_id:
                if ex.cancel_reason is None:
                    ex.cancel_reason = reason
                    self._deliver_cancel(ex)
                return
            queued = next((p for p in self.pending if p.id == exec_id), None)
            if queued is None:
                return                   # unknown or finished: ignored
            self.pending.remove(queued)
        # A queued exec that never started just ends
        if reason == "timeout":
            self.channel.send_control({"op": "out", "id": exec_id, "stream": "stderr",
                                       "data": "hostd: execution timed out"})
        self.channel.send_control({"op": "exit", "id": exec_id,
                                   "code": 124 if reason == "timeout" else 130})

    def _deliver_cancel(self, ex):
        """Signal the exec's process(es). Holds self.lock. Called again by the executor once
        the process exists if the cancel came first."""
        if ex.signalled:
            return
        if ex.language == "bash":
            if ex.proc is None:
                return
            ex.signalled = True
            try:
                os.killpg(ex.proc.pid, signal.SIGKILL)   # bash and everything it started
            except OSError:
                pass
            self.cgroups.kill("exec-%d" % ex.id)        # ...even what left its process group
            return
        w = self.worker
        if w is None or ex.worker is not w:
            return
        ex.signalled = True
        ex.cancel_clock = (time.monotonic(), self.channel.blocked_time())
        self._interrupt(w, ex)
        self._escalate_later(ex, CANCEL_GRACE)

    @staticmethod
    def _interrupt(w, ex):
        try:
            # The message closes the race with a SIGINT that lands before the cell starts
            w.send(encode({"op": "cancel", "token": ex.token}), wait=False)
            os.kill(w.proc.pid, signal.SIGINT)
        except OSError:
            pass                         # it died; the executor reports that

    def _escalate_later(self, ex, delay):
        timer = threading.Timer(delay, self._escalate, (ex,))
        timer.daemon = True
        timer.start()

    def _escalate(self, ex):
        with self.lock:
            w = self.worker
            if self.current is not ex or w is None or ex.worker is not w:
                return                   # finished meanwhile
            # Time the host spent not reading does not count: the worker cannot finish
            # while its output cannot be delivered.
            t0, blocked0 = ex.cancel_clock
            progress = (time.monotonic() - t0) - (self.channel.blocked_time() - blocked0)
            if progress < CANCEL_GRACE:
                return self._escalate_later(ex, CANCEL_GRACE - progress)
            log("exec %d ignored the interrupt; killing the REPL worker" % ex.id)
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def shutdown(self):
        """stdin closed (--stdio): kill what we started and exit."""
        with self.lock:
            procs = [self.worker.proc] if self.worker else []
            if self.current is not None and self.current.proc is not None:
                procs.append(self.current.proc)
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        os._exit(0)

    def _wake(self):
        try:
            os.write(self.wake_w, b"\0")
        except BlockingIOError:
            pass                         # the pipe is full: a wake-up is pending anyway

    # ---- executor thread ------------------------------------------------------------------

    def _executor(self):
        try:
            self._spawn_worker()         # early, so that the first exec does not wait
        except OSError as e:
            log("cannot start the Python REPL:", e)
        while True:
            try:
                self._step()
            except Exception:
                log("internal error:\n" + traceback.format_exc())
                time.sleep(0.01)         # a persistent bug must not spin a CPU

    def _step(self):
        while True:
            with self.lock:
                if self.current is not None or not self.pending:
                    break
                ex = self.current = self.pending.popleft()
            if ex.language == "python":
                self._start_python(ex)
            else:
                self._start_bash(ex)
            self._flush()
        ex = self.current
        timeout = None
        if ex is not None and ex.deadline is not None:
            timeout = max(0.0, ex.deadline - time.monotonic())
        for key, _ in self.sel.select(timeout):
            # An earlier callback of this batch may have closed this fd (a dead worker)
            if self.sel.get_map().get(key.fd) is key:
                key.data()
        ex = self.current
        if ex is not None and ex.deadline is not None and time.monotonic() >= ex.deadline:
            self._on_deadline(ex)
        self._flush()

    def _flush(self):
        """Write what this round produced, in one write (this is where backpressure blocks)."""
        if self.outbox:
            self.channel.write(self.outbox)
            del self.outbox[:]

    def _on_wake(self):
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass

    def _finish(self, ex, code):
        """Queue the exec's exit (after everything it printed). A cancel decides the code."""
        with self.lock:
            reason = ex.cancel_reason
            self.current = None
        if reason is not None:
            code = 124 if reason == "timeout" else 130
        if reason == "timeout":
            self._stderr_line(ex, "hostd: execution timed out")
        self.outbox.append(encode({"op": "exit", "id": ex.id, "code": code}))

    def _stderr_line(self, ex, text):
        self.outbox.append(encode({"op": "out", "id": ex.id, "stream": "stderr", "data": text}))

    # Python

    def _spawn_worker(self):
        w = Worker(self.workdir, self.env, self.outbox, self.cgroups.joiner("repl"))
        reg = self.sel.register
        reg(w.out.fd, selectors.EVENT_READ, lambda: self._on_worker_stream(w, w.out))
        reg(w.err.fd, selectors.EVENT_READ, lambda: self._on_worker_stream(w, w.err))
        reg(w.res_r, selectors.EVENT_READ, lambda: self._on_worker_result(w))
        reg(w.exit_fd, selectors.EVENT_READ, lambda: self._on_worker_exit(w))
        with self.lock:
            self.worker = w
        return w

    def _start_python(self, ex):
        w = self.worker
        if w is not None and w.proc.poll() is not None:
            self._on_worker_exit(w)      # died while idle, not yet noticed
            w = None
        if w is None:
            try:
                w = self._spawn_worker()
            except OSError as e:
                self._stderr_line(ex, "hostd: cannot start the Python REPL: %s" % e)
                return self._finish(ex, 1)
        if self.worker_died is not None:
            self._stderr_line(ex, "hostd: the Python REPL exited (code %d); started a fresh "
                              "one, previous state is lost" % self.worker_died)
        with self.lock:
            self.worker_died = None
            command = self._arm_python(ex, w)
            self.reseed_worker = False   # the write below completes, or the worker is gone
            ex.worker = w                # a cancel from now on can escalate to a kill
        try:
            # Outside self.lock: big code takes a while, and the main thread must stay free.
            # Only this thread closes the worker's fds, so w stays valid.
            w.send(command, wait=True)
        except OSError:
            pass                         # it just died: _on_worker_exit ends the exec
        with self.lock:
            if ex.signalled:             # during the write: its message may have been
                self._interrupt(w, ex)   # skipped, and its SIGINT came before the cell
            elif ex.cancel_reason is not None:
                self._deliver_cancel(ex)

    def _arm_python(self, ex, w):
        """Point the worker's output at exec ex; return the command that runs it. Holds
        self.lock."""
        w.out.arm(ex.id)
        w.err.arm(ex.id)
        command = {"op": "exec", "id": ex.id, "code": ex.code, "token": ex.token}
        if self.reseed_worker:
            command["reseed"] = True
        return encode(command)

    def _on_worker_stream(self, w, stream):
        if not stream.pump():
            self.sel.unregister(stream.fd)   # EOF; closed with the worker
        self._check_python_done()

    def _on_worker_result(self, w):
        try:
            data = os.read(w.res_r, 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(w.res_r)     # the worker is exiting; exit_fd will say so
            return
        w.res_buf += data
        while b"\n" in w.res_buf:
            line, _, rest = bytes(w.res_buf).partition(b"\n")
            w.res_buf[:] = rest
            ex = self.current
            if ex is None or ex.worker is not w or ex.result is not None:
                continue
            ex.result = json.loads(line)
            # The worker flushed the cell's output before writing its result: all of it is
            # in the pipes now. Read it to the end, in one round with the exit (end markers
            # on both pipes cost the guest two more wake-ups, ~1 ms of every exec under TCG).
            for stream in (w.out, w.err):
                stream.drain()
                stream.finish()
        self._check_python_done()

    def _check_python_done(self):
        ex = self.current
        if (ex is not None and ex.language == "python" and ex.result is not None
                and ex.worker.out.done and ex.worker.err.done):
            self._finish(ex, ex.result["code"])

    def _on_worker_exit(self, w):
        with self.lock:                  # reap under the lock: no cancel signals a reused pid
            status = exit_status(w.proc.wait())
        for stream in (w.out, w.err):
            stream.drain()               # output written just before dying
        ex = self.current
        during_exec = ex is not None and ex.language == "python" and ex.worker is w
        if during_exec:
            w.out.finish()
            w.err.finish()
            self._finish(ex, ex.result["code"] if ex.result is not None else status)
        for fd in w.fds():
            if fd in self.sel.get_map():
                self.sel.unregister(fd)
        with self.lock:                  # the main thread writes cmd_w only under the lock
            w.close()
            if self.worker is w:
                self.worker = None
            self.worker_died = status    # the next exec says so
        if during_exec:
            # Start the fresh worker now rather than make the next exec wait for it. (Only
            # after a death during an exec: a worker that cannot start must not loop.)
            try:
                self._spawn_worker()
            except OSError as e:
                log("cannot start the Python REPL:", e)

    # bash

    def _start_bash(self, ex):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        group = "exec-%d" % ex.id
        self.cgroups.sweep(keep=group)
        self.cgroups.make(group)
        try:
            proc = subprocess.Popen(
                ["bash", "-c", ex.code], stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                cwd=self.workdir, env=self.env, start_new_session=True,
                preexec_fn=self.cgroups.joiner(group))
        except (OSError, ValueError) as e:   # ValueError: NUL in the code
            os.close(out_r)
            os.close(err_r)
            self._stderr_line(ex, "hostd: cannot start bash: %s" % e)
            return self._finish(ex, 126)
        finally:
            os.close(out_w)
            os.close(err_w)
        ex.streams = (Stream(out_r, "stdout", self.outbox), Stream(err_r, "stderr", self.outbox))
        for stream in ex.streams:
            stream.arm(ex.id)
            self.sel.register(stream.fd, selectors.EVENT_READ,
                              lambda s=stream: self._on_bash_stream(ex, s))
        ex.exit_fd = exit_notifier(proc)
        self.sel.register(ex.exit_fd, selectors.EVENT_READ, lambda: self._on_bash_exit(ex))
        with self.lock:
            ex.proc = proc
            if ex.cancel_reason is not None:
                self._deliver_cancel(ex)

    def _on_bash_stream(self, ex, stream):
        if not stream.pump():
            self.sel.unregister(stream.fd)
            os.close(stream.fd)
            self._check_bash_done(ex)

    def _on_bash_exit(self, ex):
        with self.lock:
            ex.status = exit_status(ex.proc.wait())
        self.sel.unregister(ex.exit_fd)
        os.close(ex.exit_fd)
        ex.deadline = time.monotonic() + BASH_GRACE   # for background processes holding pipes
        self._check_bash_done(ex)

    def _check_bash_done(self, ex):
        if ex.status is not None and all(s.eof for s in ex.streams):
            self._end_bash(ex)

    def _end_bash(self, ex):
        # Nothing but the filesystem outlives a bash exec: whatever it left running in the
        # background (its cgroup) is killed now.
        self.cgroups.kill("exec-%d" % ex.id)
        self._finish(ex, ex.status)

    def _on_deadline(self, ex):
        # bash exited 1 s ago and something still holds its pipes: drop the rest
        for stream in ex.streams:
            if not stream.eof:
                stream.finish()
                self.sel.unregister(stream.fd)
                os.close(stream.fd)
                stream.eof = True
        self._end_bash(ex)


def open_port(name=PORT_NAME, timeout=5.0):
    """Open the virtio-serial port called `name`. The device may show up late after boot."""
    deadline = time.monotonic() + timeout
    while True:
        dev = None
        for path in glob.glob("/sys/class/virtio-ports/*/name"):
            try:
                with open(path) as f:
                    if f.read().strip() == name:
                        dev = "/dev/" + os.path.basename(os.path.dirname(path))
            except OSError:
                pass
        try:
            if dev is None:
                raise FileNotFoundError("no virtio port named %s" % name)
            return os.open(dev, os.O_RDWR)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENXIO):
                raise                    # only these mean "not there yet"
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def main(argv=None):
    parser = argparse.ArgumentParser(description="hostd guest agent")
    parser.add_argument("--stdio", action="store_true",
                        help="speak the protocol on stdin/stdout instead of the virtio port")
    parser.add_argument("--no-system", action="store_true",
                        help="never set the clock nor reseed the kernel RNG (tests)")
    parser.add_argument("--workdir", default="/root", help="cwd and HOME of Python and bash")
    args = parser.parse_args(argv)
    if args.stdio:
        rfd, wfd = 0, os.dup(1)
        os.dup2(2, 1)    # a stray print must not corrupt the protocol stream
    else:
        try:
            rfd = wfd = open_port()
        except OSError as e:
            log("cannot open the %s port: %s" % (PORT_NAME, e))
            return 1
    agent = Agent(Channel(wfd), os.path.abspath(args.workdir), system=not args.no_system)
    agent.serve(rfd, stdio=args.stdio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
