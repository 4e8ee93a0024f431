"""One REPL worker process (repl_worker.py), and what the agent keeps to supervise it: the
command pipe, the shared page, and its own ends of the worker's fd 1 / fd 2 pipes, read only
after the worker died (the worker reads them while it lives)."""

import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
import time

from hostd_shared_page import SharedPage
from hostd_wire import encode
from process_exit import exit_notifier

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repl_worker.py")
SYS_READ = 0                # x86-64 syscall numbers, as /proc/PID/task/TID/syscall shows them
SYS_WRITE = 1
F_SETPIPE_SZ = 1031
F_GETPIPE_SZ = 1032
FIONREAD = 0x541B
COMMAND_PIPE_SIZE = 1 << 20  # room for a default environment change (hostd caps env at 64 KiB)


class WorkerProcess:
    def __init__(self, workdir, env, repl_fds, log_fd, notice, preload, epoch, hello_epoch,
                 preexec=None):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        try:
            fcntl.fcntl(self.cmd_w, F_SETPIPE_SZ, COMMAND_PIPE_SIZE)
        except OSError:
            pass                         # the default 64 KiB still holds any cancel
        self.shared = SharedPage()
        self.shared.epoch = epoch
        self.shared.hello_epoch = hello_epoch
        self.started = time.monotonic()
        self.port_in, self.port_out = repl_fds
        config = {"port_in": self.port_in, "port_out": self.port_out, "commands": cmd_r,
                  "shared": self.shared.fd, "out_r": self.out_r, "err_r": self.err_r,
                  "log": log_fd, "notice": notice, "preload": preload}
        fds = (self.port_in, self.port_out, cmd_r, self.shared.fd, self.out_r, self.err_r,
               log_fd)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", WORKER_SCRIPT, json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, pass_fds=fds,
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

    def send(self, msg):
        """Writes one message to the command pipe, whole or not at all (the worker must never
        read half of one), without blocking: False if it does not fit (a worker that has not
        read its commands for long)."""
        data = encode(msg)
        try:
            queued = bytearray(4)
            fcntl.ioctl(self.cmd_w, FIONREAD, queued)
            room = fcntl.fcntl(self.cmd_w, F_GETPIPE_SZ) - int.from_bytes(queued, "little")
            if len(data) > room:
                return False
            os.write(self.cmd_w, data)   # only this thread writes: it all fits
        except OSError:
            return False                 # it died; the executor reports that
        self.shared.commands = self.shared.commands + 1
        return True

    def cancel(self, key, reason):
        """Forwards a cancel of exec key = (epoch, id): the message, then a SIGINT (not to a
        worker still starting: it would die of it, and it runs nothing yet). A message that
        does not fit is dropped: the SIGINT still interrupts, the escalation still kills."""
        self.send({"op": "cancel", "id": key[1], "epoch": key[0], "reason": reason})
        if not self.shared.ready:
            return
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def finished(self, key):
        """Whether exec key = (epoch, id) is over: the worker wrote its exit, or moved on to a
        later host connection."""
        hello_epoch = self.shared.hello_epoch
        return hello_epoch > key[0] or (hello_epoch == key[0] and self.shared.done >= key[1])

    def running(self):
        """(epoch, id) of the exec the worker is running now, or None."""
        s = self.shared
        hello_epoch, taken = s.hello_epoch, s.taken
        return (hello_epoch, taken) if taken > s.done else None

    def activity(self):
        """What the worker is doing: "starting" (preloading, not yet reading its port);
        "writing" while a thread is blocked writing its port (the host is not reading);
        "idle" while it waits for its port with nothing taken from it unfinished (its main
        thread in read(), or running asyncio tasks between cells); else "busy". Read from
        /proc/PID/task/TID/syscall ("NR ARG0 ..." while in a syscall)."""
        if not self.shared.ready:
            return "starting"
        pid = self.proc.pid
        reading = False
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
            if nr == SYS_READ and fd == self.port_in and path == "/proc/%d/task/%d/syscall" % (
                    pid, pid):
                reading = True
        waiting = reading or self.shared.idle_loop
        return "idle" if waiting and self.shared.taken <= self.shared.done else "busy"

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self):
        for fd in (self.cmd_w, self.out_r, self.err_r, self.exit_fd, self.shared.fd):
            os.close(fd)
