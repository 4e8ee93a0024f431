"""bash execs (guest/PROTOCOL.md, "bash semantics"): each `bash -c CODE` in a fresh process
group and cgroup, its output streamed as `out` messages, one exec at a time.

The main thread submits and cancels; everything else happens on the executor thread. `lock`
guards what they share: `current` and `pending`.
"""

import collections
import os
import signal
import subprocess
import threading
import time

from hostd_exec_end import TIMED_OUT, cancel_exit_code, cwd_error
from output_pipe import OutputPipe
from process_exit import exit_notifier, exit_status

BASH_GRACE = 1.0            # how long background processes may keep bash's pipes open


class Exec:
    """A bash exec."""

    def __init__(self, exec_id, code, env=None, cwd=None):
        self.id, self.code, self.env, self.cwd = exec_id, code, env, cwd
        self.cancel_reason = None   # set under BashRunner.lock
        self.signalled = False      # the cancel reached bash
        self.proc = None
        self.streams = ()
        self.exit_fd = None
        self.status = None          # exit status once reaped
        self.grace = None           # the timer that stops waiting for the pipes


class BashRunner:
    def __init__(self, executor, cgroups, env, workdir):
        self.executor, self.cgroups = executor, cgroups
        self.env, self.workdir = env, workdir
        self.lock = threading.Lock()
        self.current = None
        self.pending = collections.deque()
        self._when_idle = []             # executor: called once no exec runs

    # ---- main thread ----------------------------------------------------------------------

    def submit(self, ex):
        with self.lock:
            self.pending.append(ex)
        self.executor.post(self._start_next)

    def cancel(self, exec_id, reason):
        """Cancels bash exec exec_id if it is running or queued; False if it is not a bash
        exec this runner knows (a Python one, or over)."""
        with self.lock:
            ex = self.current
            if ex is not None and ex.id == exec_id:
                if ex.cancel_reason is None:
                    ex.cancel_reason = reason
                    self._deliver_cancel(ex)
                return True
            queued = next((p for p in self.pending if p.id == exec_id), None)
            if queued is None:
                return False
            self.pending.remove(queued)
        self.executor.post(lambda: self._end_unstarted(queued, reason))
        return True

    def cancel_all(self, then):
        """Ends every exec, running (killed) or queued; calls then() on the executor thread
        once none runs, after their exits were queued."""
        self.executor.post(lambda: self._cancel_all(then))

    def kill_running(self):
        """stdin closed (--stdio): the agent exits now."""
        with self.lock:
            if self.current is not None and self.current.proc is not None:
                try:
                    os.killpg(self.current.proc.pid, signal.SIGKILL)
                except OSError:
                    pass

    def _deliver_cancel(self, ex):
        """Kills the exec's processes. Holds self.lock. Called again by the executor once the
        process exists if the cancel came first."""
        if ex.signalled or ex.proc is None:
            return
        ex.signalled = True
        try:
            os.killpg(ex.proc.pid, signal.SIGKILL)   # bash and everything it started
        except OSError:
            pass
        self.cgroups.kill("exec-%d" % ex.id)        # ...even what left its process group

    # ---- executor thread ------------------------------------------------------------------

    def _start_next(self):
        with self.lock:
            if self.current is not None or not self.pending:
                return
            ex = self.current = self.pending.popleft()
        self._start(ex)

    def _cancel_all(self, then):
        with self.lock:
            queued = list(self.pending)
            self.pending.clear()
            ex = self.current
            if ex is not None and ex.cancel_reason is None:
                ex.cancel_reason = "shutdown"
                self._deliver_cancel(ex)
        for p in queued:
            self._end_unstarted(p, "shutdown")
        if self.current is None:
            then()
        else:
            self._when_idle.append(then)

    def _end_unstarted(self, ex, reason):
        """A queued exec that never started just ends."""
        if reason == "timeout":
            self._stderr_line(ex, TIMED_OUT)
        self.executor.emit({"op": "exit", "id": ex.id, "code": cancel_exit_code(reason)})

    def _start(self, ex):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        group = "exec-%d" % ex.id
        self.cgroups.sweep(keep=group)
        self.cgroups.make(group)
        cwd = ex.cwd if ex.cwd is not None else self.workdir
        env = self.env.current()
        if ex.env:
            env = dict(env, **ex.env)
        try:
            proc = subprocess.Popen(
                ["bash", "-c", ex.code], stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                cwd=cwd, env=env, start_new_session=True,
                preexec_fn=self.cgroups.joiner(group))
        except (OSError, ValueError) as e:   # ValueError: NUL in the code or env
            os.close(out_r)
            os.close(err_r)
            if isinstance(e, OSError) and e.filename == cwd:
                self._stderr_line(ex, cwd_error(cwd, e))
                return self._finish(ex, 1)
            self._stderr_line(ex, "hostd: cannot start bash: %s" % e)
            return self._finish(ex, 126)
        finally:
            os.close(out_w)
            os.close(err_w)
        outbox = self.executor.outbox
        ex.streams = (OutputPipe(out_r, "stdout", outbox), OutputPipe(err_r, "stderr", outbox))
        for stream in ex.streams:
            stream.arm(ex.id)
            self.executor.watch(stream.fd, lambda s=stream: self._on_stream(ex, s))
        ex.exit_fd = exit_notifier(proc)
        self.executor.watch(ex.exit_fd, lambda: self._on_exit(ex))
        with self.lock:
            ex.proc = proc
            if ex.cancel_reason is not None:
                self._deliver_cancel(ex)

    def _on_stream(self, ex, stream):
        if not stream.pump():
            self.executor.unwatch(stream.fd)
            os.close(stream.fd)
            self._check_done(ex)

    def _on_exit(self, ex):
        with self.lock:
            ex.status = exit_status(ex.proc.wait())
        self.executor.unwatch(ex.exit_fd)
        os.close(ex.exit_fd)
        # Background processes may hold the pipes: give them BASH_GRACE, then drop the rest
        ex.grace = self.executor.call_at(time.monotonic() + BASH_GRACE,
                                         lambda: self._on_grace_over(ex))
        self._check_done(ex)

    def _check_done(self, ex):
        if ex.status is not None and all(s.eof for s in ex.streams):
            ex.grace.cancel()
            self._end(ex)

    def _on_grace_over(self, ex):
        for stream in ex.streams:
            if not stream.eof:
                stream.finish()
                self.executor.unwatch(stream.fd)
                os.close(stream.fd)
                stream.eof = True
        self._end(ex)

    def _end(self, ex):
        # Nothing but the filesystem outlives a bash exec: whatever it left running in the
        # background (its cgroup) is killed now.
        self.cgroups.kill("exec-%d" % ex.id)
        self._finish(ex, ex.status)

    def _finish(self, ex, code):
        """Queues the exec's exit (after everything it printed). A cancel decides the code."""
        with self.lock:
            reason = ex.cancel_reason
            self.current = None
        if reason is not None:
            code = cancel_exit_code(reason)
        if reason == "timeout":
            self._stderr_line(ex, TIMED_OUT)
        self.executor.emit({"op": "exit", "id": ex.id, "code": code})
        waiting, self._when_idle = self._when_idle, []
        for then in waiting:
            then()
        self.executor.post(self._start_next)

    def _stderr_line(self, ex, text):
        self.executor.emit({"op": "out", "id": ex.id, "stream": "stderr", "data": text})
