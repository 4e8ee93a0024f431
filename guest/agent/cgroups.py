"""cgroup v2 groups that keep user code from starving the agent (guest/PROTOCOL.md, "Resource
limits"). PID 1 (sandbox-init) mounts the hierarchy and moves itself into `agent` before it
starts the agent, so every page the agent touches is charged there from its first one; the
agent sets the limits when it starts:

  agent     PID 1 and the agent. A CPU weight ten times user code's: a fork bomb or a spinning
            process does not keep the agent from reading a cancel and acting on it. Its memory
            is protected (memory.min): the kernel never reclaims the pages it runs from.
  sandbox   user code: a bash exec's `exec-ID` group each, the REPL worker's `repl`. Capped at
            512 processes, and in memory at what the kernel and the agent leave, so that user
            code runs into its own limit and its own OOM killer, which picks inside the group,
            long before the guest as a whole runs out. (Capped at RAM minus a fixed 64 MiB, a
            1 GiB guest ran out first: the kernel then reclaimed the page cache every process
            runs from, the agent's too, and thrashed for minutes before a global OOM kill.)
"""

import ctypes
import glob
import os
import signal

CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "pids", "memory")
MAX_PROCESSES = 512         # user code's processes and threads, all together
AGENT_CPU_WEIGHT = 1000     # cpu.weight: the agent gets 10/11 of the vCPU when both want it
USER_CPU_WEIGHT = 100       # the kernel's default
# What the kernel and the agent may use beyond what they hold when the agent starts: the
# agent's buffers (file transfers, relayed connections), the kernel's own allocations that no
# group pays for, and the free pages the kernel keeps.
HEADROOM = 64 << 20
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def read_meminfo(path="/proc/meminfo"):
    """/proc/meminfo as a dict of bytes."""
    info = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                info[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return info


def user_memory_cap(meminfo):
    """The bytes user code may use, read before any runs: the memory available then (what the
    kernel and the agent do not hold, less the free pages the kernel keeps) less HEADROOM."""
    return max(meminfo["MemAvailable"] - HEADROOM, 0)


class Cgroups:
    """Sets up the groups (see the module's doc), then: each bash exec gets its own group, so a
    cancel kills everything it started, even processes that left its process group; the REPL
    worker lives in `repl`. Disabled (all no-ops) without cgroup v2 (tests on a host).
    `root` and `proc` are where cgroup2 and proc are mounted (a test's fakes elsewhere)."""

    def __init__(self, enabled, log, root=CGROUP_ROOT, proc="/proc"):
        self.log, self.root, self.proc = log, root, proc
        self.sandbox = os.path.join(root, "sandbox")
        self.enabled = enabled and os.path.isfile(os.path.join(root, "cgroup.procs"))
        if self.enabled:
            self._set_up()

    def _enable_controllers(self, group):
        for name in CONTROLLERS:         # one by one: a missing one must not cost the others
            self._write(group, "cgroup.subtree_control", "+" + name)

    def _set_up(self):
        self._enable_controllers(self.root)
        agent = self._own_group()
        try:
            os.mkdir(self.sandbox)
        except FileExistsError:
            pass
        except OSError as e:
            self.log("cannot create cgroup sandbox: %s" % e)
            self.enabled = False
            return
        self._enable_controllers(self.sandbox)
        self._write(self.sandbox, "pids.max", str(MAX_PROCESSES))
        self._write(self.sandbox, "cpu.weight", str(USER_CPU_WEIGHT))
        # Set once per boot, by the first agent, before any user code ran: an agent that PID 1
        # restarted would count what user code holds as the kernel's.
        if self._read(self.sandbox, "memory.max") in (None, "max"):
            try:
                meminfo = read_meminfo(os.path.join(self.proc, "meminfo"))
                cap = user_memory_cap(meminfo)
            except (OSError, KeyError, ValueError) as e:
                self.log("cannot size user code's memory cap: %s" % e)
            else:
                self._write(self.sandbox, "memory.max", str(cap))
                if agent is not None:
                    self._write(agent, "memory.min", str(meminfo["MemTotal"] - cap))
        if agent is not None:
            self._write(agent, "cpu.weight", str(AGENT_CPU_WEIGHT))
        # The agent's children inherit what the agent has; the worker and bash reset it (join)
        self._write(os.path.join(self.proc, "self"), "oom_score_adj", "-1000")
        self.make("repl")

    def _own_group(self):
        """The agent's group: the one PID 1 put it in, or `agent`, which it then joins itself
        (a PID 1 that could not move). None if it must stay in the root group."""
        try:
            with open(os.path.join(self.proc, "self", "cgroup")) as f:
                path = next(line[3:].strip() for line in f if line.startswith("0::"))
        except (OSError, StopIteration) as e:
            self.log("cannot read the agent's cgroup: %s" % e)
            return None
        if path not in ("", "/"):
            return os.path.join(self.root, path.lstrip("/"))
        group = os.path.join(self.root, "agent")
        try:
            os.makedirs(group, exist_ok=True)
        except OSError as e:
            self.log("cannot create cgroup agent: %s" % e)
            return None
        return group if self._write(group, "cgroup.procs", str(os.getpid())) else None

    def _read(self, group, name):
        try:
            with open(os.path.join(group, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    def _write(self, group, name, value):
        try:
            with open(os.path.join(group, name), "w") as f:
                f.write(value)
            return True
        except OSError as e:
            self.log("cannot write %s to %s: %s" % (value, os.path.join(group, name), e))
            return False

    def make(self, name):
        if self.enabled:
            try:
                os.mkdir(os.path.join(self.sandbox, name))
            except FileExistsError:
                pass
            except OSError as e:
                self.log("cannot create cgroup %s: %s" % (name, e))

    def joiner(self, name, die_with_agent=False):
        """A preexec_fn moving the new process into group `name` (and back to an ordinary OOM
        score: the agent's would make it the last process the kernel kills) before it runs
        anything, and with die_with_agent, making it die with the agent's thread that starts it
        (the REPL worker: an orphan would keep the REPL port open, and an agent that /init
        restarts could not open it). It only calls os.open/os.write/prctl/getppid: safe between
        fork and exec in a threaded process."""
        if not self.enabled and not die_with_agent:
            return None
        path = os.path.join(self.sandbox, name, "cgroup.procs").encode()
        enabled = self.enabled
        agent = os.getpid()

        def write(file, data):
            try:
                fd = os.open(file, os.O_WRONLY)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except OSError:
                pass

        def join():
            if die_with_agent:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() != agent:
                    os._exit(1)          # the agent died before the prctl: no signal comes
            if not enabled:
                return
            write(path, b"0")
            write(b"/proc/self/oom_score_adj", b"0")
        return join

    def kill(self, name):
        """Kills every process of group `name` (cgroup.kill: nothing is started to do it, and
        processes forked meanwhile die too)."""
        if self.enabled:
            try:
                with open(os.path.join(self.sandbox, name, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass

    def sweep(self, keep):
        """Removes exec groups whose processes have all exited (rmdir fails while busy)."""
        if not self.enabled:
            return
        for path in glob.glob(os.path.join(self.sandbox, "exec-*")):
            if os.path.basename(path) != keep:
                try:
                    os.rmdir(path)
                except OSError:
                    pass

    def remove(self, name):
        """Removes group `name` if no process is left in it."""
        if self.enabled:
            try:
                os.rmdir(os.path.join(self.sandbox, name))
            except OSError:
                pass

    def sweep_prefix(self, prefix, keep):
        """Removes the groups named `prefix`* but those in `keep` whose processes have all
        exited (the process manager's: a process's background children keep its group)."""
        if not self.enabled:
            return
        for path in glob.glob(os.path.join(self.sandbox, prefix + "*")):
            if os.path.basename(path) not in keep:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
