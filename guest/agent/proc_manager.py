"""Processes started on the `hostd.proc` port (guest/PROTOCOL.md, "Processes port"): many at once,
outside the exec queue, each with its real guest pid, as a chosen user, with an optional stdin
pipe, a lifetime, and output read as bytes. The port server (proc_server.py) decides where
output goes (its subscribers) and how much may be read (their credit); this module owns the
processes themselves. Everything runs on the server's loop thread (selector_loop.py).

A process ends (its `end` is final) once it exited and its stdout and stderr reached EOF, or
GRACE seconds after it exited if something it started in the background still holds them: that
one keeps running in its cgroup, and what it writes later is dropped. Ended processes are kept
RETAIN seconds, so that a client connecting late still learns how it ended.
"""

import errno
import os
import signal
import subprocess
import time
from selectors import EVENT_READ, EVENT_WRITE

import guest_users
from process_exit import exit_notifier

GRACE = 1.0             # seconds the pipes may stay open after the process exited
RETAIN = 30.0           # seconds an ended process can still be connected to (its end only)
READ_MAX = 32 << 10     # bytes per read of an output pipe (and so per data frame)
MAX_INPUT = 1 << 20     # stdin bytes a process may have waiting to be written
STDOUT, STDERR = 1, 2


class StartError(Exception):
    """A process could not start: `code` is one of unknown_user, invalid_cwd, start_failed,
    invalid_argument (guest/PROTOCOL.md)."""

    def __init__(self, code, message, **fields):
        super().__init__(message)
        self.code, self.message, self.fields = code, message, fields


class InputError(Exception):
    """stdin cannot take input: code stdin_closed (never opened, or closed)."""

    def __init__(self, message):
        super().__init__(message)
        self.code, self.message = "stdin_closed", message


class Process:
    """One process: its pipes, its exit, who listens (`subs`, set by the server)."""

    def __init__(self, manager, popen, spec, cgroup):
        self.manager = manager
        self.popen = popen
        self.pid = popen.pid
        self.spec = spec                 # cmd, args, envs, cwd (resolved), tag, user
        self.cgroup = cgroup
        self.subs = []                   # the server's subscriptions, in order
        self.pipes = {}                  # STDOUT/STDERR -> read fd, until EOF
        self.stdin = None                # write fd, while stdin is open
        self.input = []                  # [bytearray, callback] waiting for stdin
        self.input_bytes = 0
        self.closing_stdin = []          # callbacks of a close_stdin waiting for the input
        self.exit_fd = None
        self.status = None               # wait status once reaped
        self.end = None                  # the `end` message once ended
        self.timed_out = False
        self.deadline = None
        self.grace = None
        self.reading = {}                # STDOUT/STDERR -> registered for reading

    @property
    def ended(self):
        return self.end is not None

    def info(self):
        s = self.spec
        info = {"pid": self.pid, "cmd": s["cmd"], "args": s["args"], "envs": s["envs"],
                "cwd": s["cwd"], "user": s["user"]}
        if s.get("tag") is not None:
            info["tag"] = s["tag"]
        return info


class ProcessManager:
    def __init__(self, loop, env, cgroups, log, on_output, on_end, default_user="root"):
        self.loop, self.env, self.cgroups, self.log = loop, env, cgroups, log
        self.on_output = on_output       # (proc, STDOUT|STDERR, bytes): to its subscribers
        self.on_end = on_end             # (proc): its end is set
        self.default_user = default_user
        self.live = {}                   # pid -> Process that has not ended
        self.ended = {}                  # pid -> (Process, forget-at monotonic)
        self.budget = lambda proc: READ_MAX   # the server sets it: bytes its subs may take
        self.seq = 0

    # ---- starting -------------------------------------------------------------------------

    def start(self, req):
        """Starts the process `req` asks for (guest/PROTOCOL.md, `start`); StartError if it
        cannot. The caller subscribes before the loop reads any output."""
        spec = self._spec(req)
        try:
            user = guest_users.lookup(spec["user"])
        except guest_users.UnknownUser:
            raise StartError("unknown_user", "invalid username: '%s'" % spec["user"]) from None
        try:
            cwd = guest_users.resolve(spec["cwd"] or "", user.home)
        except guest_users.BadPath as e:
            raise StartError("invalid_cwd", "cwd: %s" % e, path=spec["cwd"]) from None
        if not os.path.isdir(cwd):
            raise StartError("invalid_cwd", "cwd '%s' does not exist" % cwd, path=cwd)
        spec["cwd"] = cwd
        env = guest_users.environment(user, self.env.current() if self.env else {})
        env.update(spec["envs"])
        self.seq += 1
        group = "proc-%d" % self.seq
        self.cgroups.sweep_prefix("proc-", self._live_groups())
        self.cgroups.make(group)
        join, drop = self.cgroups.joiner(group), guest_users.credentials(user)

        def child():
            if join:
                join()
            if drop:
                drop()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r = in_w = None
        if spec["stdin"]:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
        try:
            popen = subprocess.Popen(
                [spec["cmd"]] + spec["args"], stdin=in_r if in_r is not None else subprocess.DEVNULL,
                stdout=out_w, stderr=err_w, cwd=cwd, env=env, start_new_session=True,
                preexec_fn=child if (join or drop) else None)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            self.cgroups.remove(group)
            raise StartError("start_failed", "cannot start %s: %s" % (
                spec["cmd"], getattr(e, "strerror", None) or e)) from None
        finally:
            for fd in (out_w, err_w, in_r):
                if fd is not None:
                    os.close(fd)
        proc = Process(self, popen, spec, group)
        self.ended.pop(proc.pid, None)   # a pid taken again: the old one's end is stale
        self.live[proc.pid] = proc
        for stream, fd in ((STDOUT, out_r), (STDERR, err_r)):
            os.set_blocking(fd, False)
            proc.pipes[stream] = fd
        if in_w is not None:
            os.set_blocking(in_w, False)
            proc.stdin = in_w
        proc.exit_fd = exit_notifier(popen)
        self.loop.want(proc.exit_fd, EVENT_READ, lambda: self._on_exit(proc))
        if spec["timeout_ms"]:
            proc.deadline = self.loop.call_later(spec["timeout_ms"] / 1000.0,
                                                 lambda: self._on_deadline(proc))
        self.refresh(proc)
        return proc

    def _spec(self, req):
        cmd, args, envs = req.get("cmd"), req.get("args", []), req.get("envs", {})
        cwd, user, tag = req.get("cwd"), req.get("user", self.default_user), req.get("tag")
        stdin, timeout_ms = req.get("stdin", False), req.get("timeout_ms", 0)
        if not isinstance(cmd, str) or not cmd:
            raise StartError("invalid_argument", "cmd must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise StartError("invalid_argument", "args must be a list of strings")
        if not isinstance(envs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise StartError("invalid_argument", "envs must be an object of strings")
        bad = next((k for k, v in envs.items() if not k or "=" in k or "\0" in k + v), None)
        if bad is not None:
            raise StartError("invalid_argument", "invalid environment variable %r" % bad)
        if "\0" in cmd or any("\0" in a for a in args):
            raise StartError("invalid_argument", "cmd and args must not hold NUL bytes")
        if cwd is not None and not isinstance(cwd, str):
            raise StartError("invalid_argument", "cwd must be a string")
        if tag is not None and not isinstance(tag, str):
            raise StartError("invalid_argument", "tag must be a string")
        if not isinstance(user, str):
            raise StartError("invalid_argument", "user must be a string")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 0:
            raise StartError("invalid_argument", "timeout_ms must be an int >= 0")
        return {"cmd": cmd, "args": list(args), "envs": dict(envs), "cwd": cwd, "user": user,
                "tag": tag, "stdin": stdin is True, "timeout_ms": timeout_ms}

    def _live_groups(self):
        return {p.cgroup for p in self.live.values()}

    # ---- finding --------------------------------------------------------------------------

    def find(self, selector):
        """The live process `selector` names ({"pid": N} or {"tag": T}), else None."""
        pid, tag = selector.get("pid"), selector.get("tag")
        if isinstance(pid, int) and not isinstance(pid, bool):
            return self.live.get(pid)
        if isinstance(tag, str):
            return next((p for p in self.live.values() if p.spec.get("tag") == tag), None)
        return None

    def find_ended(self, selector):
        """A process that ended less than RETAIN seconds ago, else None."""
        self._expire()
        pid, tag = selector.get("pid"), selector.get("tag")
        for proc, _ in self.ended.values():
            if (isinstance(pid, int) and proc.pid == pid) or (
                    isinstance(tag, str) and proc.spec.get("tag") == tag):
                return proc
        return None

    def list(self):
        return [p.info() for p in sorted(self.live.values(), key=lambda p: p.pid)]

    def _expire(self):
        now = time.monotonic()
        for pid in [pid for pid, (_, until) in self.ended.items() if until <= now]:
            del self.ended[pid]

    # ---- output ---------------------------------------------------------------------------

    def refresh(self, proc):
        """Reads proc's pipes only while its subscribers have credit (or it has none: then its
        output is read and dropped). Call whenever that may have changed."""
        may = self.budget(proc) > 0
        for stream, fd in list(proc.pipes.items()):
            if may and not proc.reading.get(stream):
                self.loop.want(fd, EVENT_READ, lambda s=stream: self._on_pipe(proc, s))
                proc.reading[stream] = True
            elif not may and proc.reading.get(stream):
                self.loop.unwant(fd, EVENT_READ)
                proc.reading[stream] = False

    def _on_pipe(self, proc, stream):
        fd = proc.pipes.get(stream)
        if fd is None:
            return
        budget = min(READ_MAX, self.budget(proc))
        if budget <= 0:
            return self.refresh(proc)
        try:
            data = os.read(fd, budget)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.log("reading the output of pid %d failed: %s" % (proc.pid, e))
            data = b""
        if not data:
            self._close_pipe(proc, stream)
            return self._check_end(proc)
        self.on_output(proc, stream, data)
        self.refresh(proc)

    def _close_pipe(self, proc, stream):
        fd = proc.pipes.pop(stream, None)
        if fd is not None:
            self.loop.forget(fd)
            os.close(fd)
        proc.reading.pop(stream, None)

    # ---- input ----------------------------------------------------------------------------

    def write_input(self, proc, data, callback):
        """Queues data for proc's stdin; callback(None) once it is in the pipe, or
        callback(InputError). An empty write succeeds at once."""
        if proc.stdin is None or proc.closing_stdin:
            return callback(InputError("stdin not enabled or closed"))
        if proc.input_bytes + len(data) > MAX_INPUT:
            return callback(InputError("too much input waiting for the process to read it"))
        if not data and not proc.input:
            return callback(None)
        proc.input.append([bytearray(data), callback])
        proc.input_bytes += len(data)
        self._write_stdin(proc)

    def close_stdin(self, proc, callback):
        """Closes proc's stdin (EOF) once what was written before is in the pipe. Closing it
        twice is no error."""
        if proc.stdin is None:
            return callback(None)
        proc.closing_stdin.append(callback)
        self._write_stdin(proc)

    def _write_stdin(self, proc):
        while proc.input and proc.stdin is not None:
            chunk, callback = proc.input[0]
            try:
                n = os.write(proc.stdin, chunk) if chunk else 0
            except (BlockingIOError, InterruptedError):
                self.loop.want(proc.stdin, EVENT_WRITE, lambda: self._write_stdin(proc))
                return
            except OSError as e:
                why = "the process closed its stdin" if e.errno == errno.EPIPE else str(e)
                return self._drop_stdin(proc, InputError("error writing to stdin: %s" % why))
            del chunk[:n]
            proc.input_bytes -= n
            if not chunk:
                proc.input.pop(0)
                callback(None)
        if proc.stdin is not None:
            self.loop.unwant(proc.stdin, EVENT_WRITE)
        if not proc.input and proc.closing_stdin:
            self._drop_stdin(proc, None)

    def _drop_stdin(self, proc, err):
        """Closes stdin; what still waits fails with err (or succeeds if None)."""
        if proc.stdin is not None:
            self.loop.forget(proc.stdin)
            os.close(proc.stdin)
            proc.stdin = None
        waiting, proc.input, proc.input_bytes = proc.input, [], 0
        closing, proc.closing_stdin = proc.closing_stdin, []
        for _, callback in waiting:
            callback(err or InputError("stdin was closed"))
        for callback in closing:
            callback(None)

    # ---- signals and lifetime -------------------------------------------------------------

    def signal(self, proc, signum):
        """SIGKILL ends everything the process started (its cgroup and process group);
        another signal goes to its process group (start_new_session: pgid = pid)."""
        if signum == signal.SIGKILL:
            self.cgroups.kill(proc.cgroup)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass

    def _on_deadline(self, proc):
        proc.deadline = None
        if proc.status is None and not proc.ended:
            proc.timed_out = True
            self.signal(proc, signal.SIGKILL)

    def _on_exit(self, proc):
        self.loop.forget(proc.exit_fd)
        os.close(proc.exit_fd)
        proc.exit_fd = None
        proc.status = proc.popen.wait()
        if proc.deadline is not None:
            proc.deadline.cancel()
            proc.deadline = None
        # Output written just before the exit is still in the pipes: read on; what runs in
        # the background may hold them, so stop waiting after GRACE.
        proc.grace = self.loop.call_later(GRACE, lambda: self._on_grace_over(proc))
        self._check_end(proc)

    def _on_grace_over(self, proc):
        if proc.pipes and self.budget(proc) <= 0:
            # Not read because its client is slow, not because something holds the pipes:
            # what waits in them is the process's own output and must not be lost
            proc.grace = self.loop.call_later(GRACE, lambda: self._on_grace_over(proc))
            return
        proc.grace = None
        for stream in list(proc.pipes):
            self._close_pipe(proc, stream)
        self._check_end(proc)

    def _check_end(self, proc):
        if proc.ended or proc.status is None or proc.pipes:
            return
        if proc.grace is not None:
            proc.grace.cancel()
            proc.grace = None
        self._drop_stdin(proc, InputError("the process ended"))
        rc = proc.status
        proc.end = {"exit_code": rc if rc >= 0 else None,
                    "signal": -rc if rc < 0 else None,
                    "timed_out": proc.timed_out}
        self.live.pop(proc.pid, None)
        self._expire()
        self.ended[proc.pid] = (proc, time.monotonic() + RETAIN)
        self.on_end(proc)

    def kill_all(self):
        """The agent is stopping (tests): nothing it started outlives it."""
        for proc in list(self.live.values()):
            self.signal(proc, signal.SIGKILL)
            try:
                proc.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass

