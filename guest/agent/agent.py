#!/usr/bin/env python3
"""hostd guest agent: the only process hostd talks to inside a VM.

Speaks the newline-delimited JSON protocol of guest/PROTOCOL.md on the virtio-serial port
named "hostd.agent" (or on stdin/stdout with --stdio, for tests): hello, ping, cancel, and
bash execs, each in a fresh process. Python execs go to the persistent REPL worker
(repl_worker.py) on its own port, "hostd.repl", and never through this process: the agent
starts the worker, forwards cancels to it, kills it when it ignores one, and when it dies
finishes its exec and starts a fresh one.
Standard library only; Python 3.9+.

Threads, and why there are three:
  main      reads the channel and handles every host message. It never writes the channel
            itself (but for the hello reply, see on_hello), so a cancel is always acted on,
            even while output is backpressured.
  executor  one selector loop: starts bash execs, turns their output pipes into `out`
            messages, detects their end, and watches the worker's exit. It writes the
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
import ctypes
import errno
import fcntl
import glob
import os
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

import files_server
import net_relay
from hostd_shared import (MAX_INPUT_LINE, TIMED_OUT, LineCutter, SharedPage, cancel_exit_code,
                          drain_budget, encode, parse_line, read_lines, write_all)

PORT_NAME = "hostd.agent"
REPL_PORT_NAME = "hostd.repl"
BASH_GRACE = 1.0            # how long background processes may keep bash's pipes open
CANCEL_GRACE = 2.0          # SIGINT -> SIGKILL escalation for the REPL worker
ESCALATE_TICK = 0.1         # how often an interrupted worker is checked meanwhile
SYS_READ = 0                # x86-64 syscall numbers, as /proc/PID/task/TID/syscall shows them
SYS_WRITE = 1
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repl_worker.py")
PYTHON_VERSION = "%d.%d.%d" % sys.version_info[:3]

RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207      # _IO('R', 0x07)
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def log(*args):
    print("hostd-agent:", *args, file=sys.stderr, flush=True)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def exit_status(returncode):
    """Popen's returncode in shell convention: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


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


class Channel:
    """The write side of the host channel. Output is written synchronously by the executor
    (that is the backpressure point); control replies go through a small writer thread."""

    def __init__(self, wfd):
        self.wfd = wfd
        self._wlock = threading.Lock()
        self._control = collections.deque()
        self._cond = threading.Condition()
        self._failed = False
        threading.Thread(target=self._control_writer, name="control", daemon=True).start()

    def write(self, chunks):
        data = b"".join(chunks)
        with self._wlock:
            try:
                write_all(self.wfd, data)
            except OSError as e:
                if not self._failed:     # host gone or port unplugged: say it once
                    log("channel write failed:", e)
                self._failed = True

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
    """One output pipe (stdout or stderr) of bash, or of a dead worker, cut into `out`
    messages (hostd_shared.LineCutter). Messages are appended to `outbox`, which the executor
    writes to the channel after each round of its loop."""

    def __init__(self, fd, name, outbox):
        os.set_blocking(fd, False)
        self.fd = fd
        self.cutter = LineCutter(name, outbox)
        self.done = True                # True: no exec listens, output is discarded
        self.eof = False

    def arm(self, exec_id):
        """Attribute what is read from now on to exec `exec_id`."""
        self.cutter.arm(exec_id)
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
            self.cutter.feed(data)
        return True

    def drain(self):
        """Read what is there without blocking: what a dead writer left (drain_budget)."""
        budget = drain_budget(self.fd)
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
                self.cutter.feed(data)

    def finish(self):
        """The exec is over for this stream: send the last partial line, stop listening."""
        if not self.done:
            self.cutter.finish()
            self.done = True


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

    def joiner(self, name, die_with_agent=False):
        """A preexec_fn moving the new process into group `name` before it runs anything, and
        with die_with_agent, making it die with the agent's thread that starts it (the REPL
        worker: an orphan would keep the REPL port open, and an agent that /init restarts
        could not open it). It only calls os.open/os.write/prctl: safe between fork and exec
        in a threaded process."""
        if not self.enabled and not die_with_agent:
            return None
        path = os.path.join(SANDBOX_CGROUP, name, "cgroup.procs").encode()
        enabled = self.enabled

        def join():
            if die_with_agent:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if not enabled:
                return
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
    """The REPL worker process, and what the agent keeps to supervise it: the command pipe
    for cancels, the shared page, and its own ends of the worker's fd 1 / fd 2 pipes, read
    only after the worker died (the worker reads them while it lives)."""

    def __init__(self, workdir, env, repl_fds, notice, epoch, preexec=None):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.shared = SharedPage()
        self.shared.epoch = epoch
        self.started = time.monotonic()
        port_in, port_out = repl_fds
        self.port_in, self.port_out = port_in, port_out
        fds = (port_in, port_out, cmd_r, self.shared.fd, self.out_r, self.err_r)
        argv = [sys.executable, "-u", WORKER_SCRIPT] + [str(fd) for fd in fds]
        if notice is not None:
            argv.append(str(notice))
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, pass_fds=fds,
                cwd=workdir, env=env, start_new_session=True,   # own group: killpg on escalation
                preexec_fn=preexec)
        except BaseException:
            for fd in (self.cmd_w, self.out_r, self.err_r, self.shared.fd):
                os.close(fd)
            raise
        finally:
            for fd in (cmd_r, out_w, err_w):
                os.close(fd)
        os.set_blocking(self.cmd_w, False)   # see send()
        self.exit_fd = exit_notifier(self.proc)

    def cancel(self, exec_id, reason, epoch):
        """Forwards a cancel: the message, the count in the shared page, then a SIGINT
        (not to a worker still starting: it would die of it, and it runs nothing yet).
        Never blocks: a message that does not fit the pipe is dropped (the SIGINT still
        interrupts; the escalation still kills)."""
        msg = {"op": "cancel", "id": exec_id, "reason": reason, "epoch": epoch}
        try:
            os.write(self.cmd_w, encode(msg))
        except BlockingIOError:
            pass
        except OSError:
            return                       # it died; the executor reports that
        self.shared.cancels = self.shared.cancels + 1
        if not self.shared.ready:
            return
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def activity(self):
        """What the worker is doing, from /proc/PID/task/TID/syscall ("NR ARG0 ..." while in
        a syscall): "writing" while a thread is blocked writing its port (the host is not
        reading), "idle" while its main thread waits for the port, with nothing taken from it
        unfinished, else "busy"."""
        pid = self.proc.pid
        for path in glob.glob("/proc/%d/task/*/syscall" % pid):
            try:
                with open(path) as f:
                    fields = f.read().split()
                if len(fields) < 2:
                    continue
                nr, fd = int(fields[0]), int(fields[1], 16)
            except (OSError, ValueError):
                continue
            if nr == SYS_WRITE and fd == self.port_out:
                return "writing"
            if (nr == SYS_READ and fd == self.port_in and path == "/proc/%d/task/%d/syscall"
                    % (pid, pid) and self.shared.taken <= self.shared.done):
                return "idle"
        return "busy"

    def close(self):
        for fd in (self.cmd_w, self.out_r, self.err_r, self.exit_fd, self.shared.fd):
            os.close(fd)


class Exec:
    """A bash exec."""

    def __init__(self, exec_id, code):
        self.id, self.code = exec_id, code
        self.cancel_reason = None   # set under Agent.lock
        self.signalled = False      # the cancel reached bash
        self.proc = None
        self.streams = ()
        self.exit_fd = None
        self.status = None          # exit status once reaped
        self.deadline = None        # monotonic time at which the executor stops waiting


class Agent:
    def __init__(self, channel, workdir, system, repl_fds):
        self.channel = channel
        self.workdir = workdir
        self.system = system
        self.repl_fds = repl_fds    # (read, write) fds of the REPL port, for the worker
        self.cgroups = Cgroups(system)
        # HOME is the work directory (PROTOCOL.md: /root, which is the default workdir)
        self.env = {"HOME": workdir, "LANG": "C.UTF-8",
                    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.env.update(net_relay.PROXY_ENV)   # HTTP(S) clients go out through hostd.net
        # Guards what the main thread shares with the executor: current, pending, worker
        # (and the worker's fds, which are closed only under it).
        self.lock = threading.Lock()
        self.current = None
        self.pending = collections.deque()
        self.worker = None
        # Python cancels, the last few (exec id -> reason): a fresh worker gets them too (one
        # may come before the worker is up), and a dead worker's exec ends with its code.
        self.python_cancels = collections.OrderedDict()
        self.epoch = 0              # hellos so far: exec ids start again at each
        self.respawn_at = None      # monotonic time to start a worker again, after a failure
        self.outbox = []            # executor: encoded messages of the current loop round
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_wake)
        threading.Thread(target=self._executor, name="executor", daemon=True).start()

    # ---- main thread: host messages -------------------------------------------------------

    def serve(self, rfd, stdio):
        read_lines(rfd, self.handle_line, log, stop_at_eof=stdio, on_oversized=lambda: self.error(
            "line longer than %d bytes dropped" % MAX_INPUT_LINE))
        self.shutdown()

    def handle_line(self, line):
        try:
            self._handle_line(line)
        except Exception as e:           # a bug must not take the agent down
            log("internal error:\n" + traceback.format_exc())
            self.error("internal error: %s" % e)

    def _handle_line(self, line):
        if not line.strip():
            return
        msg = parse_line(line)
        if msg is None:
            return self.error("malformed message: %r" % line[:200])
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
            # A new connection: exec ids start again, so every cancel so far is stale (a fork
            # child inherits its parent's). The worker runs nothing now: the VM was just
            # restored or booted.
            self.epoch += 1
            self.python_cancels.clear()
            w = self.worker
            if w is not None:
                w.shared.epoch = self.epoch
                w.shared.taken = w.shared.done = 0
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
        if language == "python":
            return self.error("Python execs go to the %s port" % REPL_PORT_NAME)
        if not is_int(exec_id) or language != "bash" or not isinstance(code, str):
            return self.error("exec needs an int id, language bash and a string code")
        with self.lock:
            self.pending.append(Exec(exec_id, code))
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
                # Not a bash exec: a Python one, running in the worker or about to (the agent
                # never sees those), or one that is over, which the worker ignores.
                self._cancel_python(exec_id, reason)
                return
            self.pending.remove(queued)
        # A queued exec that never started just ends
        if reason == "timeout":
            self.channel.send_control({"op": "out", "id": exec_id, "stream": "stderr",
                                       "data": TIMED_OUT})
        self.channel.send_control({"op": "exit", "id": exec_id,
                                   "code": cancel_exit_code(reason)})

    def _deliver_cancel(self, ex):
        """Kill the bash exec's processes. Holds self.lock. Called again by the executor once
        the process exists if the cancel came first."""
        if ex.signalled or ex.proc is None:
            return
        ex.signalled = True
        try:
            os.killpg(ex.proc.pid, signal.SIGKILL)   # bash and everything it started
        except OSError:
            pass
        self.cgroups.kill("exec-%d" % ex.id)        # ...even what left its process group

    def _cancel_python(self, exec_id, reason):
        """Holds self.lock. The worker ends the exec with 124/130 when it gets the SIGINT
        (or when it reads the exec, if the cancel came first); one that ignores it for
        CANCEL_GRACE is killed."""
        self.python_cancels[exec_id] = reason
        while len(self.python_cancels) > 64:
            self.python_cancels.popitem(last=False)
        w = self.worker
        if w is None:
            return                       # the next worker gets it when it starts
        w.cancel(exec_id, reason, self.epoch)
        self._escalate_later(w, exec_id, self.epoch, 0.0, 0)

    def _escalate_later(self, w, exec_id, epoch, progress, idle):
        timer = threading.Timer(ESCALATE_TICK, self._escalate,
                                (w, exec_id, epoch, progress, idle))
        timer.daemon = True
        timer.start()

    def _escalate(self, w, exec_id, epoch, progress, idle):
        """Kills the worker if exec_id is not over after CANCEL_GRACE: whether it runs, or
        waits in the port behind a worker that a thread of user code wedged (holding the
        GIL in C code), which therefore cannot read it."""
        with self.lock:
            if self.worker is not w or self.epoch != epoch or w.shared.done >= exec_id:
                return                   # finished meanwhile
            # Time the worker spends waiting for the host to read does not count: it cannot
            # finish while its output cannot be delivered. (Sampled, so that the worker's
            # writes pay nothing for it.)
            activity = w.activity()
            idle = idle + 1 if activity == "idle" else 0
            if idle >= 3:
                # Waiting for the port with nothing to do, it will never see exec_id: it was
                # a bash exec that just ended, or a Python one a dead worker had taken from
                # the port before it could say so. End it, in case it is the latter (the
                # host ignores an exit it does not wait for).
                code = cancel_exit_code(self.python_cancels.get(exec_id))
                try:
                    os.write(self.repl_fds[1], encode({"op": "exit", "id": exec_id,
                                                       "code": code}))
                except OSError:
                    pass
                return
            if activity == "busy":
                progress += ESCALATE_TICK
            if progress < CANCEL_GRACE:
                return self._escalate_later(w, exec_id, epoch, progress, idle)
            log("exec %d ignored the interrupt; killing the REPL worker" % exec_id)
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
        self.respawn_at = time.monotonic()   # early, so that the first exec does not wait
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
            self._start_bash(ex)
            self._flush()
        if self.respawn_at is not None and time.monotonic() >= self.respawn_at:
            self._respawn()
        ex = self.current
        timeout = None
        if ex is not None and ex.deadline is not None:
            timeout = max(0.0, ex.deadline - time.monotonic())
        if self.respawn_at is not None:
            wait = max(0.0, self.respawn_at - time.monotonic())
            timeout = wait if timeout is None else min(timeout, wait)
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
            code = cancel_exit_code(reason)
        if reason == "timeout":
            self._stderr_line(ex, TIMED_OUT)
        self.outbox.append(encode({"op": "exit", "id": ex.id, "code": code}))

    def _stderr_line(self, ex, text):
        self.outbox.append(encode({"op": "out", "id": ex.id, "stream": "stderr", "data": text}))

    # Python: the worker's life

    def _respawn(self):
        """Starts the worker; on failure (out of memory, say) tries again a second later:
        Python execs wait in the port meanwhile."""
        try:
            self._spawn_worker(self.notice)
            self.respawn_at = self.notice = None
        except OSError as e:
            log("cannot start the Python REPL:", e)
            self.respawn_at = time.monotonic() + 1.0

    notice = None                        # exit status of the last worker, for the next one

    def _spawn_worker(self, notice=None):
        with self.lock:
            epoch = self.epoch
        w = Worker(self.workdir, self.env, self.repl_fds, notice, epoch,
                   self.cgroups.joiner("repl", die_with_agent=True))
        self.sel.register(w.exit_fd, selectors.EVENT_READ, lambda: self._on_worker_exit(w))
        with self.lock:
            self.worker = w
            w.shared.epoch = self.epoch  # a hello may have come meanwhile
            for exec_id, reason in self.python_cancels.items():
                w.cancel(exec_id, reason, self.epoch)   # one may have come before it
        return w

    def _on_worker_exit(self, w):
        """The worker died (os._exit, a signal, the OOM killer, an escalation). Finishes on
        its port what it left: the messages in the shared outbox, what its pipes still hold,
        the exit of the exec it was running; then starts a fresh worker, whose first exec
        says that the state is lost."""
        with self.lock:                  # reap under the lock: no cancel signals a reused pid
            status = exit_status(w.proc.wait())
            self.sel.unregister(w.exit_fd)
            if self.worker is w:
                self.worker = None
        shared = w.shared
        data = [shared.take_outbox()]
        taken = shared.taken
        exec_id = taken if taken > shared.done else 0      # the exec it was running
        if exec_id > 0:
            msgs = []
            for fd, name in ((w.out_r, "stdout"), (w.err_r, "stderr")):
                stream = Stream(fd, name, msgs)
                stream.arm(exec_id)
                stream.drain()
                stream.finish()
            with self.lock:
                reason = self.python_cancels.get(exec_id)
            if reason == "timeout":
                msgs.append(encode({"op": "out", "id": exec_id, "stream": "stderr",
                                    "data": TIMED_OUT}))
            code = status if reason is None else cancel_exit_code(reason)
            msgs.append(encode({"op": "exit", "id": exec_id, "code": code}))
            data += msgs
        # Says the worker is gone, and how far it had read the port: the host ends the Python
        # execs up to `upto` that are still open (the worker took one it never got to run),
        # and leaves the later ones to the next worker, which reads them from the port.
        data.append(encode({"op": "repl_died", "code": status, "upto": taken}))
        try:
            write_all(self.repl_fds[1], b"".join(data))
        except OSError as e:
            log("REPL port write failed:", e)
        with self.lock:
            w.close()
        # A worker that dies as it starts must not be restarted in a tight loop
        self.notice = status
        lived = time.monotonic() - w.started
        self.respawn_at = time.monotonic() + (0.0 if lived > 1.0 else 0.5)

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
    parser.add_argument("--repl-fds", metavar="IN,OUT",
                        help="with --stdio: the fds the REPL worker reads and writes (tests)")
    parser.add_argument("--workdir", default="/root", help="cwd and HOME of Python and bash")
    args = parser.parse_args(argv)
    if args.stdio:
        rfd, wfd = 0, os.dup(1)
        os.dup2(2, 1)    # a stray print must not corrupt the protocol stream
        repl_fds = tuple(int(fd) for fd in (args.repl_fds or "").split(",") if fd)
        if len(repl_fds) != 2:
            parser.error("--stdio needs --repl-fds IN,OUT")
    else:
        try:
            rfd = wfd = open_port()
            repl_fd = open_port(REPL_PORT_NAME)
        except OSError as e:
            log("cannot open the virtio ports: %s" % e)
            return 1
        repl_fds = (repl_fd, repl_fd)
        files_server.start(open_port)    # hostd.files, in its own thread: never behind an exec
        net_relay.start(open_port)       # hostd.net: the guest's only way out
    for fd in repl_fds:
        os.set_inheritable(fd, False)    # only the worker gets them (pass_fds)
    agent = Agent(Channel(wfd), os.path.abspath(args.workdir), not args.no_system, repl_fds)
    agent.serve(rfd, stdio=args.stdio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
