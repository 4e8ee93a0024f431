"""The guest agent under test, driven through its real protocol (guest/PROTOCOL.md).

Each test starts `agent.py --stdio --no-system --workdir <tmp> --repl-fds IN,OUT` and talks
JSON lines to it: to the agent on its stdin/stdout (the `hostd.agent` port in a VM), and to
the REPL worker on two pipes (the `hostd.repl` port), where Python execs go. The two ports are
read separately, as hostd reads them: nothing orders a message on one after a message on the
other.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENT = os.path.join(AGENT_DIR, "agent.py")
FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakes")
NOTICE = "hostd: the Python REPL exited (code %d); started a fresh one, previous state is lost"
TIMED_OUT = "hostd: execution timed out"

if AGENT_DIR not in sys.path:
    sys.path.insert(0, AGENT_DIR)        # unit tests import the agent's modules


class Result:
    def __init__(self, events, code, rejected=None):
        self.events = events                       # the exec's messages but its exit, in order
        self.code = code
        self.rejected = rejected                   # why the exec was not run, if it was not
        self.stdout = [m["data"] for m in events if m.get("stream") == "stdout"]
        self.stderr = [m["data"] for m in events if m.get("stream") == "stderr"]
        self.displays = [m["data"] for m in events if m["op"] == "display"]
        # Notebook mode and contexts (docs/api.md, "Notebook mode")
        self.results = [m["data"] for m in events if m["op"] == "result"]
        self.exceptions = [m for m in events if m["op"] == "exception"]
        self.starts = [m for m in events if m["op"] == "start"]
        self.answers = [m for m in events if m["op"] == "context"]


class Port:
    """One end of a port: JSON lines in, never blocking past a deadline. Empty lines are
    skipped, as hostd skips them."""

    def __init__(self, name, fd, process):
        self.name, self.fd, self.process = name, fd, process
        self.buf = b""

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if line:
                    return json.loads(line)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                # With what the agent logged: a message that never came is a bug to find there
                raise AssertionError("no message on %s within %.1f s; the agent's stderr ends:\n%s"
                                     % (self.name, timeout, self.process.log()[-4000:]))
            data = os.read(self.fd, 1 << 20)
            if not data:
                raise AssertionError("the agent closed %s; its stderr:\n%s"
                                     % (self.name, self.process.log()))
            self.buf += data


class AgentProcess:
    def __init__(self, workdir, template_file=None):
        self.workdir = workdir
        self.stderr = tempfile.TemporaryFile()
        repl_in, self.repl_w = os.pipe()          # host -> worker
        self.repl_r, repl_out = os.pipe()         # worker -> host
        template_file = template_file or os.path.join(workdir, "no-template.json")
        self.proc = subprocess.Popen(
            [sys.executable, AGENT, "--stdio", "--no-system", "--workdir", workdir,
             "--repl-fds", "%d,%d" % (repl_in, repl_out), "--template-file", template_file],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            pass_fds=(repl_in, repl_out))
        os.close(repl_in)
        os.close(repl_out)
        self.agent_port = Port("the agent port", self.proc.stdout.fileno(), self)
        self.repl_port = Port("the REPL port", self.repl_r, self)
        self.next_id = 1
        self.hellos = 0

    # ---- the agent port ---------------------------------------------------------------------

    def send(self, msg):
        self.send_raw(json.dumps(msg).encode() + b"\n")

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout=10.0):
        return self.agent_port.recv(timeout)

    def request(self, msg, timeout=10.0):
        """Sends a message with a nonce and returns the reply carrying it (same op)."""
        self.send(msg)
        reply = self.recv(timeout)
        if (reply.get("op"), reply.get("nonce")) != (msg["op"], msg["nonce"]):
            raise AssertionError("expected the reply to %r, got %r" % (msg, reply))
        return reply

    def hello(self, copy=None):
        """What hostd does on every connection (a restore, a fork, a restart): the agent's
        hello, then, with its first Python exec, the REPL's. Exec ids start again."""
        self.agent_hello(copy)
        self.repl_hello()

    def agent_hello(self, copy=None):
        """`copy`: whether the VM is a new copy of a frozen state (True) or goes on (False);
        None leaves the field out, as an older hostd did."""
        self.hellos += 1
        msg = {"op": "hello", "nonce": "hello%d" % self.hellos,
               "time_ns": str(time.time_ns()), "seed": "00" * 32}
        if copy is not None:
            msg["copy"] = copy
        # Written as hostd writes it (no spaces): with `copy`, the agent's fast path takes it
        self.send_raw(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        reply = self.recv()
        if (reply.get("op"), reply.get("nonce")) != ("hello", msg["nonce"]):
            raise AssertionError("expected the reply to %r, got %r" % (msg, reply))
        self.next_id = 1

    def repl_hello(self):
        """Returns what the REPL port said before the echo, which hostd drops: it belongs to
        the previous connection."""
        nonce = "repl-hello-%d" % self.hellos
        self.send_repl({"op": "hello", "nonce": nonce})
        before = []
        while True:
            msg = self.recv_repl()
            if (msg.get("op"), msg.get("nonce")) == ("hello", nonce):
                return before
            before.append(msg)

    # ---- the REPL port ----------------------------------------------------------------------

    def send_repl(self, msg):
        self.send_repl_raw(json.dumps(msg).encode() + b"\n")

    def send_repl_raw(self, data):
        os.write(self.repl_w, data)

    def recv_repl(self, timeout=10.0):
        return self.repl_port.recv(timeout)

    # ---- execs ------------------------------------------------------------------------------

    def context(self, action, **fields):
        """A context request (create, list, delete, restart) on the REPL port; its answer."""
        exec_id, self.next_id = self.next_id, self.next_id + 1
        self.send_repl(dict(op="context", id=exec_id, action=action, **fields))
        result = self.collect(exec_id)
        assert result.code == 0 and len(result.answers) == 1, result.events
        return result.answers[0]

    def start(self, code, language="python", **options):
        """Sends an exec (options: env, cwd, display, context, notebook) to the port of its
        language."""
        exec_id, self.next_id = self.next_id, self.next_id + 1
        msg = dict(op="exec", id=exec_id, code=code, **options)
        if language == "python":
            self.send_repl(msg)
        else:
            msg["language"] = language
            self.send(msg)
        return exec_id

    def collect(self, exec_id, language="python", timeout=15.0, ignore=()):
        """Reads the exec's messages up to its exit (nothing else may arrive meanwhile, but
        the agent's note that a worker died, which follows that worker's last exit, and
        messages of the execs in `ignore`, which hostd has ended already)."""
        port = self.repl_port if language == "python" else self.agent_port
        deadline = time.monotonic() + timeout
        events = []
        while True:
            msg = port.recv(max(0.01, deadline - time.monotonic()))
            if msg["op"] == "repl_died" or msg.get("id") in ignore:
                continue
            if msg.get("id") != exec_id or msg["op"] not in (
                    "out", "display", "exit", "result", "exception", "start", "context"):
                raise AssertionError("unexpected message %r" % (msg,))
            if msg["op"] == "exit":
                return Result(events, msg["code"], msg.get("rejected"))
            events.append(msg)

    def run(self, code, language="python", timeout=15.0, **options):
        return self.collect(self.start(code, language, **options), language, timeout)

    # ---- the processes ----------------------------------------------------------------------

    def worker_pid(self, timeout=5.0):
        def find():
            for pid in descendants(self.proc.pid):
                try:
                    with open("/proc/%d/cmdline" % pid, "rb") as f:
                        if b"repl_worker.py" in f.read():
                            return pid
                except OSError:
                    pass
            return None
        return wait_for(find, timeout, "a REPL worker running")

    def rss_kib(self, pid=None):
        with open("/proc/%d/status" % (pid or self.proc.pid)) as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def log(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self):
        # Closing stdin makes the agent kill its worker and bash, then exit; whatever is
        # left of its process tree (the agent hung, say) is killed here.
        leftovers = descendants(self.proc.pid)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdout.close()
        self.stderr.close()
        os.close(self.repl_r)
        os.close(self.repl_w)


def wait_for(condition, timeout=10.0, what="the condition"):
    """condition()'s first true value, polled until timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out waiting for %s" % what)
        time.sleep(0.01)


def main_thread_syscall(pid):
    """The syscall number the process's main thread is blocked in, or None when it runs."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            fields = f.read().split()
    except OSError:
        return None
    return int(fields[0]) if fields and fields[0] not in ("running", "-1") else None


def descendants(pid):
    """Pids of the live descendants of pid (Linux /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class AgentTestCase(unittest.TestCase):
    def setUp(self):
        self.workdir = os.path.realpath(tempfile.mkdtemp(prefix="hostd-agent-test-"))
        self.addCleanup(shutil.rmtree, self.workdir, True)
        template_file = None
        template = self.template()
        if template is not None:
            template_file = os.path.join(self.workdir, "template.json")
            with open(template_file, "w") as f:
                f.write(template if isinstance(template, str) else json.dumps(template))
        self.agent = AgentProcess(self.workdir, template_file)
        self.addCleanup(self.agent.close)

    def template(self):
        """The contents of the agent's template file (a dict, or raw text), or None for no
        file. self.workdir exists already."""
        return None

    def path(self, name):
        return os.path.join(self.workdir, name)

    def run_ok(self, code, language="python", **options):
        result = self.agent.run(code, language, **options)
        self.assertEqual(result.code, 0, "stdout=%r stderr=%r" % (result.stdout, result.stderr))
        return result

    def kill_later(self, pid):
        def kill():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.addCleanup(kill)
