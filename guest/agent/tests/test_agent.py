"""Behaviour of the guest agent, driven through its real protocol (guest/PROTOCOL.md).

Each test starts `agent.py --stdio --no-system --workdir <tmp> --repl-fds IN,OUT` and talks
JSON lines to it: to the agent on its stdin/stdout (the `hostd.agent` port in a VM), and to
the REPL worker on two pipes (the `hostd.repl` port), where Python execs go.
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

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent.py")
NOTICE = "hostd: the Python REPL exited (code %d); started a fresh one, previous state is lost"
TIMED_OUT = "hostd: execution timed out"


class Result:
    def __init__(self, events, code):
        self.events = events                       # [(arrival monotonic time, message)]
        self.code = code
        self.stdout = [m["data"] for _, m in events if m["stream"] == "stdout"]
        self.stderr = [m["data"] for _, m in events if m["stream"] == "stderr"]


class AgentProcess:
    """The agent under test, with a line reader (of both channels, in arrival order) that never
    blocks past a deadline."""

    def __init__(self, workdir):
        self.stderr = tempfile.TemporaryFile()
        repl_in, self.repl_w = os.pipe()          # host -> worker
        self.repl_r, repl_out = os.pipe()         # worker -> host
        self.proc = subprocess.Popen(
            [sys.executable, AGENT, "--stdio", "--no-system", "--workdir", workdir,
             "--repl-fds", "%d,%d" % (repl_in, repl_out)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            pass_fds=(repl_in, repl_out))
        os.close(repl_in)
        os.close(repl_out)
        self.fd = self.proc.stdout.fileno()
        self.bufs = {self.fd: b"", self.repl_r: b""}
        self.next_id = 1

    def send(self, msg):
        """To the agent (the hostd.agent port)."""
        self.send_raw(json.dumps(msg).encode() + b"\n")

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send_repl(self, msg):
        """To the REPL worker (the hostd.repl port)."""
        self.send_repl_raw(json.dumps(msg).encode() + b"\n")

    def send_repl_raw(self, data):
        os.write(self.repl_w, data)

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            for fd, buf in self.bufs.items():
                if b"\n" in buf:
                    line, self.bufs[fd] = buf.split(b"\n", 1)
                    return json.loads(line)
            remaining = deadline - time.monotonic()
            ready = select.select(list(self.bufs), [], [], max(0, remaining))[0]
            if remaining <= 0 or not ready:
                raise AssertionError("no message from the agent within %.1f s" % timeout)
            for fd in ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    raise AssertionError("the agent closed a channel; its stderr:\n" + self.log())
                self.bufs[fd] += data

    def start(self, code, language="python"):
        exec_id, self.next_id = self.next_id, self.next_id + 1
        msg = {"op": "exec", "id": exec_id, "language": language, "code": code}
        if language == "python":
            self.send_repl(msg)
        else:
            self.send(msg)
        return exec_id

    def collect(self, exec_id, timeout=15.0):
        """Read the exec's messages up to its exit (nothing else may arrive meanwhile, but
        the agent's note that a worker died, which follows that worker's last exit)."""
        deadline = time.monotonic() + timeout
        events = []
        while True:
            msg = self.recv(max(0.01, deadline - time.monotonic()))
            if msg["op"] == "repl_died":
                continue
            if msg.get("id") != exec_id or msg["op"] not in ("out", "exit"):
                raise AssertionError("unexpected message %r" % (msg,))
            if msg["op"] == "exit":
                return Result(events, msg["code"])
            events.append((time.monotonic(), msg))

    def run(self, code, language="python", timeout=15.0):
        return self.collect(self.start(code, language), timeout)

    def worker_pid(self, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in descendants(self.proc.pid):
                try:
                    with open("/proc/%d/cmdline" % pid, "rb") as f:
                        if b"repl_worker.py" in f.read():
                            return pid
                except OSError:
                    pass
            time.sleep(0.02)
        raise AssertionError("no REPL worker running")

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
        self.agent = AgentProcess(self.workdir)
        self.addCleanup(self.agent.close)

    def run_ok(self, code, language="python"):
        result = self.agent.run(code, language)
        self.assertEqual(result.code, 0, "stdout=%r stderr=%r" % (result.stdout, result.stderr))
        return result

    def kill_later(self, pid):
        def kill():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.addCleanup(kill)


class ControlMessages(AgentTestCase):
    def test_hello_echoes_nonce_with_pid_and_python_version(self):
        self.agent.send({"op": "hello", "nonce": "abc", "time_ns": time.time_ns(),
                         "seed": "ab" * 32})
        msg = self.agent.recv()
        self.assertEqual(msg["op"], "hello")
        self.assertEqual(msg["nonce"], "abc")
        self.assertEqual(msg["pid"], self.agent.proc.pid)
        self.assertEqual(msg["python"].split(".")[:2], [str(v) for v in sys.version_info[:2]])

    def test_a_hello_on_the_repl_port_is_echoed_and_reseeds_the_random_module(self):
        # Without the reseed, the next random() would be the first value after seed(1)
        self.run_ok("import random\nrandom.seed(1)\nfirst = random.Random(1).random()")
        self.agent.send_repl({"op": "hello", "nonce": "n"})
        msg = self.agent.recv()
        self.assertEqual((msg["op"], msg["nonce"]), ("hello", "n"))
        self.assertEqual(msg["pid"], self.agent.worker_pid())
        self.assertEqual(self.run_ok("random.random() != first").stdout, ["True"])

    def test_garbage_glued_before_a_repl_hello_is_discarded(self):
        self.agent.send_repl_raw(b'{"op":"exec","id":9,"co' + b'{"op":"hello","nonce":"r"}\n')
        self.assertEqual(self.agent.recv(), {"op": "hello", "nonce": "r",
                                             "pid": self.agent.worker_pid()})
        self.assertEqual(self.run_ok("print('ok')").stdout, ["ok"])

    def test_bad_messages_on_the_repl_port_get_errors_and_the_worker_lives_on(self):
        self.run_ok("kept = 1")
        for raw in (b'{"op":"frobnicate"}\n', b'{"op":"exec","id":"one","code":"1"}\n',
                    b'{"op":"exec","id":1}\n'):
            self.agent.send_repl_raw(raw)
            self.assertEqual(self.agent.recv()["op"], "error", raw)
        self.agent.send_repl_raw(b"not json at all\n")        # noise: dropped, no answer
        self.assertEqual(self.run_ok("kept").stdout, ["1"])

    def test_a_python_exec_on_the_agent_port_is_refused(self):
        self.agent.send({"op": "exec", "id": 1, "language": "python", "code": "1"})
        self.assertIn("hostd.repl", self.agent.recv()["message"])

    def test_garbage_glued_before_hello_is_discarded(self):
        # A restored VM may hold half a line from before the snapshot
        hello = {"op": "hello", "nonce": "after-restore", "time_ns": 1, "seed": "00" * 32}
        self.agent.send_raw(b'{"op":"exec","id":9,"langu' + json.dumps(hello).encode() + b"\n")
        msg = self.agent.recv()
        self.assertEqual((msg["op"], msg["nonce"]), ("hello", "after-restore"))

    def test_ping_is_answered_with_pong(self):
        self.agent.send({"op": "ping", "nonce": "p1"})
        self.assertEqual(self.agent.recv(), {"op": "pong", "nonce": "p1"})

    def test_bad_json_unknown_op_and_bad_fields_get_errors_and_the_agent_lives_on(self):
        for raw in (b"this is not json\n", b'{"op":"frobnicate"}\n', b"[1,2]\n", b"\xff\xfe\n",
                    b'{"op":"exec","id":"one","language":"python","code":"1"}\n',
                    b'{"op":"exec","id":1,"language":"ruby","code":"1"}\n'):
            self.agent.send_raw(raw)
            msg = self.agent.recv()
            self.assertEqual(msg["op"], "error", raw)
            self.assertIsInstance(msg["message"], str)
        self.assertEqual(self.run_ok("print('alive')").stdout, ["alive"])

    def test_cancel_of_unknown_or_finished_exec_is_ignored(self):
        exec_id = self.agent.start("1")
        self.agent.collect(exec_id)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        self.agent.send({"op": "cancel", "id": 999, "reason": "timeout"})
        self.agent.send({"op": "ping", "nonce": "x"})
        self.assertEqual(self.agent.recv(), {"op": "pong", "nonce": "x"})


class PythonSemantics(AgentTestCase):
    def test_variables_imports_and_open_files_persist(self):
        self.run_ok("import math\nx = 41\nf = open('data.txt', 'w')")
        self.run_ok("f.write(str(x + 1)); f.write(' %.2f' % math.pi); f.close()")
        self.assertEqual(self.run_ok("print(open('data.txt').read())").stdout, ["42 3.14"])

    def test_namespace_is_main_and_cwd_is_workdir(self):
        result = self.run_ok("import os\nprint(__name__)\nprint(os.getcwd())")
        self.assertEqual(result.stdout, ["__main__", self.workdir])

    def test_last_expression_repr_is_printed_like_a_notebook(self):
        self.assertEqual(self.run_ok("x = 20\nx + 22").stdout, ["42"])
        self.assertEqual(self.run_ok("'text'").stdout, ["'text'"])
        self.assertEqual(self.run_ok("None").stdout, [])
        self.assertEqual(self.run_ok("y = 5").stdout, [])
        self.assertEqual(self.run_ok("print('a')\n[1, 2]").stdout, ["a", "[1, 2]"])
        self.assertEqual(self.run_ok("if True:\n    7").stdout, [])   # not a top-level expression
        self.assertEqual(self.run_ok("1; 2").stdout, ["2"])            # the last statement only
        self.assertEqual(self.run_ok("(1 +\n 2)").stdout, ["3"])
        result = self.agent.run("  1")                                   # as in a module
        self.assertEqual((result.code, result.stderr[-1].split(":")[0]), (1, "IndentationError"))

    def test_exception_prints_traceback_without_worker_frames_and_exits_1(self):
        result = self.agent.run("def f():\n    return 1 / 0\nf()")
        self.assertEqual(result.code, 1)
        text = "\n".join(result.stderr)
        self.assertTrue(result.stderr[0].startswith("Traceback"), text)
        self.assertEqual(result.stderr[-1], "ZeroDivisionError: division by zero")
        self.assertIn("return 1 / 0", text)          # source lines are shown
        self.assertNotIn("repl_worker", text)
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])

    def test_large_code_runs(self):
        code = "data = [\n" + "".join("    %d,\n" % i for i in range(30000)) + "]\nsum(data)"
        self.assertGreater(len(code), 200000)
        self.assertEqual(self.run_ok(code).stdout, [str(sum(range(30000)))])

    def test_syntax_error_exits_1(self):
        result = self.agent.run("x = = 1")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr[-1], "SyntaxError: invalid syntax")

    def test_system_exit_sets_the_code_and_the_repl_survives(self):
        self.run_ok("kept = 'yes'")
        self.assertEqual(self.agent.run("import sys; sys.exit(3)").code, 3)
        self.assertEqual(self.agent.run("sys.exit()").code, 0)
        result = self.agent.run("sys.exit('bye')")
        self.assertEqual((result.code, result.stderr), (1, ["bye"]))
        self.assertEqual(self.run_ok("kept").stdout, ["'yes'"])

    def test_raw_fd_and_subprocess_output_is_captured(self):
        result = self.run_ok("import os, subprocess\nos.write(1, b'raw\\n')\n"
                             "subprocess.run(['sh', '-c', 'echo sub; echo suberr >&2'])\n"
                             "None")
        self.assertEqual(result.stdout, ["raw", "sub"])
        self.assertEqual(result.stderr, ["suberr"])

    def test_worker_death_reports_its_code_then_a_fresh_worker_starts_with_a_notice(self):
        self.run_ok("x = 1")
        result = self.agent.run("import os\nprint('bye', flush=True)\nos._exit(3)")
        self.assertEqual((result.stdout, result.code), (["bye"], 3))
        result = self.agent.run("print('fresh')\nx")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stdout, ["fresh"])
        self.assertEqual(result.stderr[0], NOTICE % 3)
        self.assertIn("NameError", result.stderr[-1])

    def test_worker_killed_by_signal_reports_128_plus_signal(self):
        result = self.agent.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual(result.code, 128 + signal.SIGKILL)
        self.assertEqual(self.agent.run("1").stderr, [NOTICE % (128 + signal.SIGKILL)])

    def test_output_printed_just_before_a_crash_is_not_lost(self):
        # Printed lines wait in the page the worker shares with the agent, not in the worker
        result = self.agent.run("import os, signal\nprint('last words')\n"
                                "os.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual((result.stdout, result.code), (["last words"], 128 + signal.SIGKILL))

    def test_the_agent_says_when_the_worker_died(self):
        exec_id = self.agent.start("import os\nos._exit(5)")
        self.assertEqual(self.agent.recv(), {"op": "exit", "id": exec_id, "code": 5})
        self.assertEqual(self.agent.recv(), {"op": "repl_died", "code": 5, "upto": exec_id})

    def test_the_worker_dies_with_the_agent(self):
        # Else it would keep the REPL port open, and a restarted agent could not open it
        worker = self.agent.worker_pid()
        os.kill(self.agent.proc.pid, signal.SIGKILL)
        self.agent.proc.wait()
        deadline = time.monotonic() + 5
        while os.path.exists("/proc/%d" % worker) and time.monotonic() < deadline:
            with open("/proc/%d/stat" % worker) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break                            # dead, not yet reaped
            time.sleep(0.02)
        else:
            self.assertFalse(os.path.exists("/proc/%d" % worker), "the worker outlived the agent")

    def test_a_cancel_from_before_a_hello_does_not_touch_the_execs_after_it(self):
        # A fork child inherits its parent's unread cancels, and its exec ids start again
        self.run_ok("x = 1")
        self.agent.send({"op": "cancel", "id": 3, "reason": "timeout"})    # a stale race
        time.sleep(0.5)
        self.agent.send({"op": "hello", "nonce": "child", "time_ns": 1, "seed": "00" * 32})
        msg = self.agent.recv()
        if msg["op"] == "exit":        # the agent ended id 3 on the REPL port: no worker had it
            self.assertEqual(msg, {"op": "exit", "id": 3, "code": 124})
            msg = self.agent.recv()
        self.assertEqual(msg["nonce"], "child")
        self.agent.next_id = 1
        for _ in range(3):
            self.assertEqual(self.run_ok("print('ran')").stdout, ["ran"])

    def test_a_cancelled_exec_behind_a_wedged_worker_ends_and_the_worker_is_replaced(self):
        # A thread of user code holds the GIL in C code: the worker cannot even read exec 2
        self.run_ok("import threading\nthreading.Timer(0.3, lambda: 10 ** 10 ** 9).start()")
        time.sleep(1.0)
        exec_id = self.agent.start("print('never')")
        time.sleep(0.2)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        msgs = []
        deadline = time.monotonic() + 10
        while not any(m.get("op") == "repl_died" for m in msgs) and time.monotonic() < deadline:
            msgs.append(self.agent.recv(max(0.01, deadline - time.monotonic())))
        died = next(m for m in msgs if m["op"] == "repl_died")
        self.assertEqual(died["code"], 128 + signal.SIGKILL)
        # The host ends it from repl_died: it had cancelled it (guest/PROTOCOL.md)
        self.assertNotIn("never", [m.get("data") for m in msgs])
        self.assertEqual(self.agent.run("print('fresh')").stdout, ["fresh"])

    def test_a_sigint_from_user_code_interrupts_like_in_any_python(self):
        result = self.agent.run("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
                                "import time\ntime.sleep(5)")
        self.assertEqual(result.code, 130)
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])


class OutputFraming(AgentTestCase):
    def test_one_event_per_line_and_order_within_each_stream(self):
        result = self.run_ok("import sys\nsys.stdout.write('a\\nb\\nc\\n')\n"
                             "for i in range(50):\n    print(i)\n    print(-i, file=sys.stderr)\n"
                             "None")
        self.assertEqual(result.stdout, ["a", "b", "c"] + [str(i) for i in range(50)])
        self.assertEqual(result.stderr, [str(-i) for i in range(50)])

    def test_stdout_and_stderr_interleave_in_time_order(self):
        result = self.run_ok("import sys, time\nprint('out1')\ntime.sleep(0.05)\n"
                             "print('err1', file=sys.stderr)\ntime.sleep(0.05)\nprint('out2')")
        self.assertEqual([m["data"] for _, m in result.events], ["out1", "err1", "out2"])

    def test_python_stdout_and_stderr_keep_their_order_without_pauses(self):
        result = self.run_ok("import sys\nfor i in range(20):\n"
                             "    print('o%d' % i)\n    print('e%d' % i, file=sys.stderr)\n"
                             "raise SystemExit(0)")
        expected = [x for i in range(20) for x in ('o%d' % i, 'e%d' % i)]
        self.assertEqual([m["data"] for _, m in result.events], expected)

    def test_a_cells_output_is_complete_before_its_exit_even_when_written_last(self):
        # Output still in the pipes when the worker reports the cell done is read first.
        code = ("import os, sys\nsys.stdout.write('x' * 200000 + '\\n')\n"
                "os.write(2, b'raw err last')\nNone")
        for _ in range(5):
            result = self.run_ok(code)
            self.assertEqual(len("".join(result.stdout)), 200000)
            self.assertEqual(result.stderr, ["raw err last"])

    def test_a_cell_that_closes_or_redirects_fd_1_still_ends(self):
        result = self.run_ok("import os\nprint('before', flush=True)\nos.close(1)\nNone")
        self.assertEqual(result.stdout, ["before"])
        result = self.agent.run("import os\nos.dup2(2, 1)\nprint('now on stderr')")
        self.assertEqual(result.code, 0)

    def test_empty_lines_are_kept(self):
        self.assertEqual(self.run_ok("print('a\\n\\nb')").stdout, ["a", "", "b"])

    def test_last_line_without_newline_is_still_sent(self):
        result = self.run_ok("import os\nos.write(1, b'line\\nno newline')\n"
                             "os.write(2, b'err no newline')\nNone")
        self.assertEqual(result.stdout, ["line", "no newline"])
        self.assertEqual(result.stderr, ["err no newline"])
        self.assertEqual(self.run_ok("printf 'a\\nb'", "bash").stdout, ["a", "b"])

    def test_invalid_utf8_is_replaced(self):
        result = self.run_ok("import os\nos.write(1, b'ok \\xff\\xfe \\xc3\\xa9\\n')\nNone")
        self.assertEqual(result.stdout, ["ok \ufffd\ufffd \u00e9"])

    def test_long_line_is_split_on_character_boundaries_and_nothing_is_lost(self):
        # 'é' is 2 bytes and starts at odd offsets: a naive 65536-byte cut would split one
        line = "x" + "\u00e9" * 100000 + "tail"
        result = self.run_ok("print('x' + '\\u00e9' * 100000 + 'tail')\nprint('next')", "python")
        *pieces, after = result.stdout
        self.assertEqual(after, "next")
        self.assertGreater(len(pieces), 1)
        for piece in pieces:
            self.assertLessEqual(len(piece.encode()), 65536)
            self.assertNotIn("\ufffd", piece)
        self.assertEqual("".join(pieces), line)
        # Same through bash, with an exact multiple of 65536 bytes (no spurious empty line)
        result = self.run_ok("head -c 131072 /dev/zero | tr '\\0' y; echo; echo end", "bash")
        self.assertEqual([len(p) for p in result.stdout], [65536, 65536, 3])

    def test_lines_stream_while_the_exec_runs(self):
        result = self.run_ok("import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.5)")
        self.assertEqual(result.stdout, ["0", "1", "2"])
        times = [t for t, _ in result.events]
        self.assertGreater(times[1] - times[0], 0.35)
        self.assertGreater(times[2] - times[1], 0.35)

    def test_bash_lines_stream_too(self):
        result = self.run_ok("for i in 1 2; do echo $i; sleep 0.4; done", "bash")
        times = [t for t, _ in result.events]
        self.assertEqual(result.stdout, ["1", "2"])
        self.assertGreater(times[1] - times[0], 0.25)


class Bash(AgentTestCase):
    def test_each_exec_is_a_fresh_process_but_the_filesystem_persists(self):
        self.run_ok("export FOO=1; cd /; echo hi > %s/f.txt; echo $$ > %s/pid"
                    % (self.workdir, self.workdir), "bash")
        result = self.run_ok("echo ${FOO:-unset}; pwd; cat f.txt; [ $$ != $(cat pid) ] && echo new",
                             "bash")
        self.assertEqual(result.stdout, ["unset", self.workdir, "hi", "new"])

    def test_environment_and_stdin(self):
        result = self.run_ok("echo $HOME; echo $PATH; echo $LANG; cat; echo done", "bash")
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        self.assertEqual(result.stdout, [self.workdir, path, "C.UTF-8", "done"])

    def test_exit_code_and_signal_death(self):
        result = self.agent.run("echo out; echo err >&2; exit 7", "bash")
        self.assertEqual((result.stdout, result.stderr, result.code), (["out"], ["err"], 7))
        self.assertEqual(self.agent.run("kill -TERM $$", "bash").code, 128 + signal.SIGTERM)

    def test_background_process_holding_the_pipes_does_not_hang_the_exec(self):
        t0 = time.monotonic()
        result = self.run_ok("sleep 30 & echo $!", "bash")
        self.kill_later(int(result.stdout[0]))
        self.assertLess(time.monotonic() - t0, 3.0)      # bash exit + the 1 s rule
        self.assertEqual(self.run_ok("echo next", "bash").stdout, ["next"])

    def test_cancel_kills_the_whole_process_group(self):
        exec_id = self.agent.start("sleep 30 & echo $!; sleep 30; echo never", "bash")
        self.kill_later(int(self.agent.recv()["data"]))          # the background pid
        t0 = time.monotonic()
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id)
        self.assertEqual((result.code, result.stdout), (130, []))
        self.assertLess(time.monotonic() - t0, 2.0)


class Cancel(AgentTestCase):
    def test_timeout_cancel_interrupts_keeps_state_and_exits_124(self):
        self.run_ok("x = 'kept'")
        exec_id = self.agent.start("import time\nprint('started', flush=True)\ntime.sleep(30)")
        self.assertEqual(self.agent.recv()["data"], "started")
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        result = self.agent.collect(exec_id, timeout=5)
        self.assertEqual(result.code, 124)
        self.assertEqual(result.stderr, [TIMED_OUT])
        self.assertEqual(self.run_ok("x").stdout, ["'kept'"])   # same worker, no notice

    def test_client_cancel_exits_130_without_the_timeout_line(self):
        exec_id = self.agent.start("import time\ntime.sleep(30)")
        # Sent at once: it may well arrive before the cell has started
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id, timeout=5)
        self.assertEqual((result.code, result.stderr), (130, []))
        self.assertEqual(self.run_ok("print(1)").stderr, [])

    def test_cancel_of_a_loop_that_swallows_keyboard_interrupt_restarts_the_worker(self):
        self.run_ok("state = 1")
        exec_id = self.agent.start("import time\nprint('go', flush=True)\nwhile True:\n"
                                   "    try:\n        time.sleep(10)\n"
                                   "    except KeyboardInterrupt:\n        pass")
        self.agent.recv()
        time.sleep(0.2)                                      # let it enter the loop
        t0 = time.monotonic()
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        result = self.agent.collect(exec_id, timeout=6)
        self.assertEqual((result.code, result.stderr), (124, [TIMED_OUT]))
        self.assertGreater(time.monotonic() - t0, 1.8)       # SIGINT first, SIGKILL after 2 s
        result = self.agent.run("state")
        self.assertEqual(result.stderr[0], NOTICE % (128 + signal.SIGKILL))
        self.assertIn("NameError", result.stderr[-1])

    def test_infinite_output_is_cancellable(self):
        exec_id = self.agent.start("while True:\n    print('x' * 1000)")
        for _ in range(100):
            self.assertEqual(self.agent.recv()["data"], "x" * 1000)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id, timeout=10)
        self.assertEqual(result.code, 130)
        self.assertTrue(all(line.strip("x") == "" for line in result.stdout))
        self.assertEqual(self.run_ok("print('after')").stdout, ["after"])

    def test_backpressure_bounds_memory_and_cancel_still_works(self):
        self.run_ok("kept = True")
        exec_id = self.agent.start("while True:\n    print('x' * 1000)")
        self.agent.recv()                                   # output is flowing
        time.sleep(0.3)                                     # stop reading: pipes fill up
        worker = self.agent.worker_pid()
        rss_before = self.agent.rss_kib(worker)
        time.sleep(1.2)
        rss_after = self.agent.rss_kib(worker)
        self.assertLess(rss_after - rss_before, 4096, "worker memory grew while blocked")
        # The cancel is read and acted on although the agent cannot write; the host stays
        # away past the 2 s escalation delay, which must not count while output is blocked
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        time.sleep(2.5)
        result = self.agent.collect(exec_id, timeout=10)
        self.assertEqual(result.code, 124)
        self.assertEqual(result.stderr, [TIMED_OUT])
        self.assertEqual(self.run_ok("kept").stdout, ["True"])   # interrupted, not killed


class Performance(AgentTestCase):
    def test_trivial_exec_round_trip_is_fast(self):
        self.run_ok("print(1)")                             # warm up
        samples = []
        for _ in range(50):
            t0 = time.perf_counter()
            self.run_ok("print(1)")
            samples.append(time.perf_counter() - t0)
        samples.sort()
        # Generous bound for loaded CI machines; typical is well under 1 ms
        self.assertLess(samples[len(samples) // 2], 0.005)


if __name__ == "__main__":
    unittest.main()
