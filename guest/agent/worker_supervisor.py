"""Supervision of the REPL worker (guest/PROTOCOL.md): the agent is not on a Python exec's path,
but keeps what must work even when user code wedges the worker. It starts the worker, forwards
cancels and default environment changes to it, kills it when it ignores a cancel, and when it
dies finishes on the REPL port what it left and starts a fresh one.

Execs are named by (epoch, id) (repl_interrupts.py). `lock` guards what the main thread shares
with the executor and the escalation timers: worker, epoch, python_cancels, unwatched, and the
worker's fds, which are closed only under it.
"""

import collections
import os
import threading
import time

from default_env import diff
from hostd_exec_end import TIMED_OUT, cancel_exit_code
from hostd_wire import encode, write_all
from output_pipe import OutputPipe
from process_exit import exit_status
from worker_process import WorkerProcess

CANCEL_GRACE = 2.0          # SIGINT -> SIGKILL escalation for the REPL worker
ESCALATE_TICK = 0.1         # how often an interrupted worker is checked meanwhile
IDLE_TICKS = 3              # ticks seen idle before the agent ends the exec itself


class Escalation:
    """A cancel being watched: the worker is killed if exec `key` is not over after CANCEL_GRACE
    of its time (time it spends blocked writing to a host that does not read does not count)."""

    def __init__(self, worker, key, epoch):
        self.worker, self.key, self.epoch = worker, key, epoch
        self.progress = 0.0
        self.idle = 0


class Supervisor:
    def __init__(self, executor, env, repl_fds, cgroups, workdir, preload, log):
        self.executor, self.env, self.cgroups, self.log = executor, env, cgroups, log
        self.repl_fds = repl_fds    # (read, write) fds of the REPL port, for the worker
        self.workdir, self.preload = workdir, list(preload)
        self.log_fd = os.dup(2)     # the worker logs where the agent does (the VM console)
        os.set_inheritable(self.log_fd, False)
        self.lock = threading.Lock()
        self.worker = None
        self.epoch = 0              # hellos so far: exec ids start again at each
        # Python cancels, the last few ((epoch, id) -> reason): a fresh worker gets them too
        # (one may come before the worker is up), and a dead worker's exec ends with its code.
        self.python_cancels = collections.OrderedDict()
        # Those of them that came while there was no worker (it had died and the next one was
        # not started yet, or the first one was being started): nothing watches them until
        # the next worker does (_spawn), or one whose exec is unknown would never end.
        self.unwatched = set()
        self.hello_epoch = 0        # the last worker's, for the next one
        self.notice = None          # exit status of the last worker, for the next one

    def start(self):
        self.executor.post(self._respawn)

    # ---- main thread ----------------------------------------------------------------------

    def on_hello(self, copy):
        """A new host connection: exec ids start again. `copy`: the VM is a new copy of a frozen
        state, so the worker's random generators are its siblings' too (a worker started later
        is a new process, seeded on its own)."""
        with self.lock:
            self.epoch += 1
            self.python_cancels.clear()
            self.unwatched.clear()
            if self.worker is not None:
                self.worker.shared.epoch = self.epoch
                if copy:
                    self.worker.shared.copies += 1

    def cancel(self, exec_id, reason):
        """Cancels Python exec exec_id of this connection, running in the worker or about to
        (or over: the worker ignores that). The worker ends it with 124/130 when it gets the
        SIGINT, or when it reads the exec if the cancel came first."""
        with self.lock:
            self._cancel((self.epoch, exec_id), reason)

    def cancel_running(self, reason):
        """Cancels whatever exec the worker runs now, of any connection (cancel_all)."""
        with self.lock:
            w = self.worker
            key = w.running() if w is not None else None
            if key is not None:
                self._cancel(key, reason)

    def set_sandbox_env(self, variables):
        """The sandbox's own default variables changed: the running worker applies them before
        its next cell, a fresh one starts with them. False if the worker could not be told."""
        with self.lock:
            changed, unset = self.env.set_sandbox(variables)
            w = self.worker
            if w is None or not (changed or unset):
                return True
            return w.send({"op": "env", "set": changed, "unset": unset})

    def wait_ready(self, timeout):
        """Waits until a worker has preloaded its modules and reads its port (or timeout
        seconds); whether it has."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if self.worker is not None and self.worker.shared.ready:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def kill(self):
        with self.lock:
            if self.worker is not None:
                self.worker.kill()

    def _cancel(self, key, reason):
        """Holds self.lock."""
        self.python_cancels[key] = reason
        while len(self.python_cancels) > 64:
            self.unwatched.discard(self.python_cancels.popitem(last=False)[0])
        w = self.worker
        if w is None:
            self.unwatched.add(key)      # the next worker gets it, and is watched, when it starts
            return
        w.cancel(key, reason)
        self._escalate_later(Escalation(w, key, self.epoch))

    # ---- escalation timers ----------------------------------------------------------------

    def _escalate_later(self, esc):
        timer = threading.Timer(ESCALATE_TICK, self._escalate, (esc,))
        timer.daemon = True
        timer.start()

    def _escalate(self, esc):
        """Kills the worker if the exec is not over after CANCEL_GRACE: whether it runs, or
        waits in the port behind a worker that a thread of user code wedged (holding the GIL
        in C code), which therefore cannot read it."""
        with self.lock:
            w = esc.worker
            if self.worker is not w or self.epoch != esc.epoch or w.finished(esc.key):
                return                   # finished meanwhile, or its host is gone
            # Sampled, so that the worker's writes pay nothing for it
            activity = w.activity()
            esc.idle = esc.idle + 1 if activity == "idle" else 0
            if esc.idle >= IDLE_TICKS:
                # Waiting for the port with nothing to do, it will never see the exec: it was
                # a bash exec that just ended, or a Python one a dead worker had taken from
                # the port before it could say so. End it, in case it is the latter (the
                # host ignores an exit it does not wait for).
                code = cancel_exit_code(self.python_cancels.get(esc.key))
                try:
                    os.write(self.repl_fds[1], encode({"op": "exit", "id": esc.key[1],
                                                       "code": code}))
                except OSError:
                    pass
                return
            if activity == "busy":
                esc.progress += ESCALATE_TICK
            if esc.progress < CANCEL_GRACE:
                return self._escalate_later(esc)
            self.log("exec %d ignored the interrupt; killing the REPL worker" % esc.key[1])
            w.kill()

    # ---- executor thread ------------------------------------------------------------------

    def _respawn(self):
        """Starts the worker; on failure (out of memory, say) tries again a second later:
        Python execs wait in the port meanwhile."""
        try:
            self._spawn()
        except (OSError, ValueError) as e:
            self.log("cannot start the Python REPL:", e)
            self.executor.call_at(time.monotonic() + 1.0, self._respawn)

    def _spawn(self):
        with self.lock:
            epoch, env = self.epoch, self.env.current()
        w = WorkerProcess(self.workdir, env, self.repl_fds, self.log_fd, self.notice,
                          self.preload, epoch, self.hello_epoch,
                          self.cgroups.joiner("repl", die_with_agent=True))
        self.notice = None
        self.executor.watch(w.exit_fd, lambda: self._on_exit(w))
        with self.lock:
            self.worker = w
            w.shared.epoch = self.epoch  # a hello may have come meanwhile
            if self.env.current() is not env:   # ...or a set_env
                changed, unset = diff(env, self.env.current())
                w.send({"op": "env", "set": changed, "unset": unset})
            for key, reason in self.python_cancels.items():
                w.cancel(key, reason)    # one may have come before it
                if key in self.unwatched:
                    # Watched as if it had come now: this worker ends it if the exec waits in
                    # the port (or kills it if it cannot read it), else the agent ends it once
                    # the worker is idle, as for any cancel of an exec the worker never sees.
                    self._escalate_later(Escalation(w, key, self.epoch))
            self.unwatched.clear()

    def _on_exit(self, w):
        """The worker died (os._exit, a signal, the OOM killer, an escalation). Finishes on its
        port what it left: the messages in the shared outbox, what its pipes still hold, the
        exit of the exec it was running; then starts a fresh worker, whose first exec says
        that the state is lost."""
        with self.lock:                  # reap under the lock: no cancel signals a reused pid
            status = exit_status(w.proc.wait())
            self.executor.unwatch(w.exit_fd)
            if self.worker is w:
                self.worker = None
            epoch = self.epoch
        shared = w.shared
        data = [shared.take_outbox()]
        key = w.running()
        if key is not None:
            msgs = []
            for fd, name in ((w.out_r, "stdout"), (w.err_r, "stderr")):
                pipe = OutputPipe(fd, name, msgs)
                pipe.arm(key[1])
                pipe.drain()
                pipe.finish()
            with self.lock:
                reason = self.python_cancels.get(key)
            if reason == "timeout":
                msgs.append(encode({"op": "out", "id": key[1], "stream": "stderr",
                                    "data": TIMED_OUT}))
            code = status if reason is None else cancel_exit_code(reason)
            msgs.append(encode({"op": "exit", "id": key[1], "code": code}))
            data += msgs
        # Says the worker is gone, and how far it had read the port in this connection: the
        # host ends the Python execs up to `upto` that are still open (the worker took one
        # it never got to run), and leaves the later ones to the next worker.
        upto = shared.taken if shared.hello_epoch == epoch else 0
        data.append(encode({"op": "repl_died", "code": status, "upto": upto}))
        try:
            write_all(self.repl_fds[1], b"".join(data))
        except OSError as e:
            self.log("REPL port write failed:", e)
        self.hello_epoch = shared.hello_epoch
        with self.lock:
            w.close()
        # A worker that dies as it starts must not be restarted in a tight loop
        self.notice = status
        lived = time.monotonic() - w.started
        self.executor.call_at(time.monotonic() + (0.0 if lived > 1.0 else 0.5), self._respawn)
