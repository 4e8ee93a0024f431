"""cgroup v2 groups for user code, under the `sandbox` group that /init caps on processes and
memory: a fork bomb or a memory hog runs into its own limits (the OOM killer picks within the
group) and never starves the agent."""

import ctypes
import glob
import os
import signal

SANDBOX_CGROUP = "/sys/fs/cgroup/sandbox"
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class Cgroups:
    """Each bash exec gets its own group, so a cancel kills everything it started, even
    processes that left its process group; the REPL worker lives in `repl`. Disabled (all
    no-ops) when /init did not create the group, e.g. in tests on a host."""

    def __init__(self, enabled, log):
        self.log = log
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
                self.log("cannot create cgroup %s: %s" % (name, e))

    def joiner(self, name, die_with_agent=False):
        """A preexec_fn moving the new process into group `name` before it runs anything, and
        with die_with_agent, making it die with the agent's thread that starts it (the REPL
        worker: an orphan would keep the REPL port open, and an agent that /init restarts
        could not open it). It only calls os.open/os.write/prctl/getppid: safe between fork
        and exec in a threaded process."""
        if not self.enabled and not die_with_agent:
            return None
        path = os.path.join(SANDBOX_CGROUP, name, "cgroup.procs").encode()
        enabled = self.enabled
        agent = os.getpid()

        def join():
            if die_with_agent:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() != agent:
                    os._exit(1)          # the agent died before the prctl: no signal comes
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

    def remove(self, name):
        """Removes group `name` if no process is left in it."""
        if self.enabled:
            try:
                os.rmdir(os.path.join(SANDBOX_CGROUP, name))
            except OSError:
                pass

    def sweep_prefix(self, prefix, keep):
        """Removes the groups named `prefix`* but those in `keep` whose processes have all
        exited (the process manager's: a process's background children keep its group)."""
        if not self.enabled:
            return
        for path in glob.glob(os.path.join(SANDBOX_CGROUP, prefix + "*")):
            if os.path.basename(path) not in keep:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
