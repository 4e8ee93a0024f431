"""Behaviour of the processes port (guest/PROTOCOL.md, "Processes port"), driven through its
framing by a minimal host (proc_host.py) against proc_server.py running in a thread.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import hashlib
import os
import shutil
import signal
import tempfile
import time
import unittest

from proc_host import Failed, ProcHost
from port_frames import DATA

import proc_server

ROOT_HOME = os.path.expanduser("~root")


class ProcTestCase(unittest.TestCase):
    def setUp(self):
        self.host = ProcHost()
        self.addCleanup(self.host.close)
        self.host.hello()
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="hostd-proc-test-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def assertFails(self, code, fn, *args, **kwargs):
        with self.assertRaises(Failed) as ctx:
            fn(*args, **kwargs)
        self.assertEqual(ctx.exception.code, code, ctx.exception.msg)
        return ctx.exception.msg

    def wait_listed(self, pid, listed=True):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pids = [p["pid"] for p in self.host.call("list")["processes"]]
            if (pid in pids) == listed:
                return
        self.fail("pid %d is %slisted" % (pid, "not " if listed else ""))


class Hello(ProcTestCase):
    def test_hello_is_answered_with_its_nonce_and_the_protocol_version(self):
        msg = self.host.hello("abc")
        self.assertEqual((msg["op"], msg["nonce"], msg["version"]), ("hello", "abc", 1))


class Start(ProcTestCase):
    def test_start_answers_the_real_pid_first_then_output_then_the_end(self):
        sub, pid = self.host.bash("echo out; echo err >&2; echo $$")
        out, err, end = self.host.collect(sub)
        self.assertEqual(out, b"out\n%d\n" % pid)
        self.assertEqual(err, b"err\n")
        self.assertEqual(end, {"op": "end", "exit_code": 0, "signal": None, "timed_out": False})

    def test_the_exit_code_is_the_processes_own(self):
        self.assertEqual(self.host.run("exit 3")[2]["exit_code"], 3)

    def test_output_is_bytes_as_written_not_text(self):
        out, _, _ = self.host.run(r"printf '\xff\x00\xfe'")
        self.assertEqual(out, b"\xff\x00\xfe")

    def test_a_process_runs_with_cmd_and_args_as_given_no_shell_in_between(self):
        sub, _ = self.host.start("printf", "%s|", "a b", "$HOME")
        self.assertEqual(self.host.collect(sub)[0], b"a b|$HOME|")

    def test_a_missing_program_fails_to_start(self):
        self.assertFails("start_failed", self.host.start, "/no/such/program")

    def test_many_processes_run_at_once(self):
        subs = [self.host.bash("read x; echo $x-%d" % i, stdin=True)[0] for i in range(8)]
        pids = [p["pid"] for p in self.host.call("list")["processes"]]
        self.assertEqual(len(pids), 8)
        for pid in pids:
            self.host.input(pid, b"go\n")
        outs = sorted(self.host.collect(sub)[0] for sub in subs)
        self.assertEqual(outs, sorted(b"go-%d\n" % i for i in range(8)))

    def test_a_background_child_holding_the_pipes_does_not_hold_the_end(self):
        sub, _ = self.host.bash("sleep 60 & echo $!")
        out, _, end = self.host.collect(sub, timeout=20)
        self.assertEqual(end["exit_code"], 0)
        child = int(out)
        self.addCleanup(lambda: os.kill(child, signal.SIGKILL))
        os.kill(child, 0)    # still running: only its output is dropped


class Environment(ProcTestCase):
    def test_env_is_the_sandbox_default_with_the_users_home_and_the_requests_variables(self):
        out, _, _ = self.host.run('echo "$HOME|$USER|$LOGNAME|$LANG|$A"', envs={"A": "1"},
                                  user="root")
        self.assertEqual(out.decode(), "%s|root|root|C.UTF-8|1\n" % ROOT_HOME)

    def test_a_requests_variables_do_not_leak_into_the_next_process(self):
        self.host.run("true", envs={"LEAK": "1"})
        self.assertEqual(self.host.run('echo "[$LEAK]"')[0], b"[]\n")

    def test_an_invalid_variable_name_is_refused(self):
        self.assertFails("invalid_argument", self.host.bash, "true", envs={"A=B": "1"})


class WorkingDirectory(ProcTestCase):
    def test_the_default_cwd_is_the_users_home(self):
        self.assertEqual(self.host.run("pwd")[0].decode().strip(), ROOT_HOME)

    def test_a_relative_cwd_is_relative_to_the_home_and_tilde_is_the_home(self):
        rel = os.path.relpath(self.dir, ROOT_HOME)
        self.assertEqual(self.host.run("pwd", cwd=rel)[0].decode().strip(), self.dir)
        self.assertEqual(self.host.run("pwd", cwd="~")[0].decode().strip(), ROOT_HOME)

    def test_a_missing_cwd_is_refused_with_its_resolved_path(self):
        msg = self.assertFails("invalid_cwd", self.host.bash, "true", cwd="/no/such/dir")
        self.assertIn("cwd '/no/such/dir' does not exist", msg["message"])


@unittest.skipUnless(os.geteuid() == 0, "running as another user needs root")
class Users(ProcTestCase):
    def test_a_process_runs_with_the_users_ids_home_and_names(self):
        out, _, _ = self.host.run('id -u; id -g; echo "$HOME $USER"', user="nobody", cwd="/")
        self.assertEqual(out.decode().split("\n")[:3], ["65534", "65534", "/nonexistent nobody"])

    def test_an_unknown_user_is_refused(self):
        msg = self.assertFails("unknown_user", self.host.bash, "true", user="no-such-user")
        self.assertIn("invalid username: 'no-such-user'", msg["message"])


class Stdin(ProcTestCase):
    def test_input_reaches_the_process_and_closing_stdin_ends_it(self):
        sub, pid = self.host.start("cat", stdin=True)
        self.host.input(pid, b"hello ")
        self.host.input(pid, b"\x00bytes")
        self.host.call("close_stdin", pid=pid)
        out, _, end = self.host.collect(sub)
        self.assertEqual((out, end["exit_code"]), (b"hello \x00bytes", 0))

    def test_large_input_goes_through_in_order(self):
        data = os.urandom(300_000)
        sub, pid = self.host.bash("sha256sum", stdin=True)
        self.host.input(pid, data)
        self.host.call("close_stdin", pid=pid)
        self.assertEqual(self.host.collect(sub)[0].split()[0].decode(),
                         hashlib.sha256(data).hexdigest())

    def test_without_stdin_input_is_refused_and_the_process_reads_eof(self):
        sub, pid = self.host.bash("cat; echo done", stdin=False)
        out, _, _ = self.host.collect(sub)
        self.assertEqual(out, b"done\n")
        sub, pid = self.host.bash("read x", stdin=False)
        self.host.collect(sub)

    def test_input_to_a_process_without_stdin_is_an_error(self):
        sub, pid = self.host.start("sleep", "30")
        self.addCleanup(self.host.call, "signal", pid=pid, signal=9)
        self.assertFails("stdin_closed", self.host.input, pid, b"x")

    def test_closing_stdin_twice_is_no_error_but_input_after_it_is(self):
        sub, pid = self.host.start("sleep", "30", stdin=True)
        self.addCleanup(self.host.call, "signal", pid=pid, signal=9)
        self.host.call("close_stdin", pid=pid)
        self.host.call("close_stdin", pid=pid)
        self.assertFails("stdin_closed", self.host.input, pid, b"x")


class ListAndSignal(ProcTestCase):
    def test_list_shows_running_processes_with_their_config(self):
        sub, pid = self.host.start("sleep", "30", envs={"K": "v"}, cwd="/tmp", tag="t1")
        procs = self.host.call("list")["processes"]
        self.assertEqual(procs, [{"pid": pid, "cmd": "sleep", "args": ["30"], "envs": {"K": "v"},
                                  "cwd": "/tmp", "user": "root", "tag": "t1"}])
        self.host.call("signal", pid=pid, signal=signal.SIGKILL)
        self.assertEqual(self.host.collect(sub)[2]["signal"], signal.SIGKILL)
        self.assertEqual(self.host.call("list")["processes"], [])

    def test_sigterm_ends_a_process_and_the_end_says_so(self):
        sub, pid = self.host.start("sleep", "30")
        self.host.call("signal", pid=pid, signal=signal.SIGTERM)
        end = self.host.collect(sub)[2]
        self.assertEqual((end["exit_code"], end["signal"]), (None, signal.SIGTERM))

    def test_sigkill_ends_what_the_process_started_too(self):
        sub, pid = self.host.bash("sleep 60 & echo $!; wait")
        kind, payload = self.host.recv(sub)
        child = int(payload[1:])
        self.host.call("signal", pid=pid, signal=signal.SIGKILL)
        self.host.collect(sub)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with open("/proc/%d/stat" % child) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        return           # dead, not reaped yet
            except FileNotFoundError:
                return
        self.fail("the child survived")

    def test_a_process_can_be_selected_by_its_tag(self):
        sub, pid = self.host.start("sleep", "30", tag="server")
        self.host.call("signal", tag="server", signal=signal.SIGKILL)
        self.assertEqual(self.host.collect(sub)[2]["signal"], signal.SIGKILL)

    def test_unknown_pids_are_not_found(self):
        self.assertFails("not_found", self.host.call, "signal", pid=999999, signal=9)
        self.assertFails("not_found", self.host.input, 999999, b"x")
        self.assertFails("not_found", self.host.call, "close_stdin", pid=999999)

    def test_an_unsupported_signal_is_refused(self):
        self.assertFails("invalid_argument", self.host.call, "signal", pid=1, signal=11)


class Lifetime(ProcTestCase):
    def test_a_process_past_its_lifetime_is_killed_and_the_end_says_it_timed_out(self):
        sub, pid = self.host.start("sleep", "60", timeout_ms=300)
        end = self.host.collect(sub)[2]
        self.assertEqual((end["signal"], end["timed_out"]), (signal.SIGKILL, True))

    def test_the_lifetime_holds_after_its_stream_is_detached(self):
        sub, pid = self.host.start("sleep", "60", timeout_ms=300)
        self.host.send_json(sub, {"op": "detach"})
        self.wait_listed(pid, listed=False)


class ConnectAndDetach(ProcTestCase):
    def test_a_detached_process_runs_on_and_a_connect_gets_its_next_output(self):
        sub, pid = self.host.bash("read a; echo got-$a; read b; echo got-$b", stdin=True)
        self.host.send_json(sub, {"op": "detach"})
        self.host.input(pid, b"1\n")         # its output goes nowhere: no stream listens
        again = self.host.request("connect", pid=pid)
        self.assertEqual(self.host.recv(again)[1], {"op": "started", "pid": pid})
        self.host.input(pid, b"2\n")
        out, _, end = self.host.collect(again)
        # got-1 may still have been in the pipe when the connect came: it is not replayed, but
        # what was not read yet is the new stream's
        self.assertTrue(out.endswith(b"got-2\n"), out)
        self.assertEqual(end["exit_code"], 0)

    def test_two_streams_of_one_process_both_get_everything(self):
        sub, pid = self.host.bash("read a; echo $a", stdin=True)
        other = self.host.request("connect", pid=pid)
        self.host.recv(other)
        self.host.input(pid, b"both\n")
        self.assertEqual(self.host.collect(sub)[0], b"both\n")
        self.assertEqual(self.host.collect(other)[0], b"both\n")

    def test_connecting_to_a_process_that_just_ended_gives_its_end(self):
        sub, pid = self.host.bash("exit 7")
        self.host.collect(sub)
        again = self.host.request("connect", pid=pid)
        self.assertEqual(self.host.recv(again)[1], {"op": "started", "pid": pid})
        self.assertEqual(self.host.recv(again)[1]["exit_code"], 7)

    def test_connecting_to_an_unknown_pid_is_not_found(self):
        sub = self.host.request("connect", pid=999999)
        self.assertEqual(self.host.recv(sub)[1]["code"], "not_found")

    def test_a_new_hello_drops_every_stream_but_not_the_processes(self):
        sub, pid = self.host.bash("read a; echo $a", stdin=True)
        self.host.hello("again")
        self.wait_listed(pid)
        again = self.host.request("connect", pid=pid)
        self.host.recv(again)
        self.host.input(pid, b"x\n")
        self.assertEqual(self.host.collect(again)[0], b"x\n")
        self.assertEqual(len(self.host.frames[sub]), 0)

    def test_host_changed_drops_every_stream_as_a_hello_does(self):
        sub, pid = self.host.start("sleep", "30")
        self.addCleanup(self.host.call, "signal", pid=pid, signal=9)
        self.host.server.host_changed()
        self.host.call("list")           # answered after the reset (jobs run first)
        self.assertEqual(self.host.server.subs, {})


class Credit(ProcTestCase):
    def test_output_waits_for_credit_and_none_is_lost(self):
        size = 1 << 20
        sub, _ = self.host.bash("head -c %d /dev/zero | tr '\\0' x" % size)
        got, in_flight = 0, 0
        while True:
            kind, payload = self.host.recv(sub)
            if kind != DATA:
                self.assertEqual(payload["op"], "end")
                break
            in_flight += len(payload)
            self.assertLessEqual(in_flight, proc_server.WINDOW)
            got += len(payload) - 1
            if in_flight == proc_server.WINDOW:      # the guest stopped: give it all back
                self.host.credit(sub, in_flight)
                in_flight = 0
        self.assertEqual(got, size)


class Watch(ProcTestCase):
    def watch(self, path, **fields):
        sub = self.host.request("watch", path=path, **fields)
        kind, msg = self.host.recv(sub)
        if msg["op"] == "error":
            raise Failed(msg)
        self.assertEqual(msg["op"], "started")
        return sub

    def test_creating_writing_and_removing_a_file_are_events_named_relative_to_the_dir(self):
        sub = self.watch(self.dir)
        path = os.path.join(self.dir, "f.txt")
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        events = self.host.events(sub, lambda ev: ("f.txt", "remove") in
                                  [(e["name"], e["type"]) for e in ev])
        kinds = [e["type"] for e in events if e["name"] == "f.txt"]
        self.assertEqual(kinds[0], "create")
        self.assertIn("write", kinds)

    def test_a_recursive_watch_names_nested_entries_and_sees_new_directories(self):
        sub = self.watch(self.dir, recursive=True)
        os.mkdir(os.path.join(self.dir, "a"))
        self.host.events(sub, lambda ev: any(e["name"] == "a" for e in ev))
        with open(os.path.join(self.dir, "a", "b.txt"), "w") as f:
            f.write("x")
        self.host.events(sub, lambda ev: any(e["name"] == "a/b.txt" and e["type"] == "create"
                                             for e in ev))

    def test_a_plain_watch_does_not_see_nested_entries(self):
        os.mkdir(os.path.join(self.dir, "a"))
        sub = self.watch(self.dir)
        with open(os.path.join(self.dir, "a", "inner"), "w"):
            pass
        with open(os.path.join(self.dir, "top"), "w"):
            pass
        events = self.host.events(sub, lambda ev: any(e["name"] == "top" for e in ev))
        self.assertNotIn("a/inner", [e["name"] for e in events])

    def test_entries_come_with_created_files_when_asked(self):
        sub = self.watch(self.dir, entries=True)
        with open(os.path.join(self.dir, "e"), "w"):
            pass
        events = self.host.events(sub, lambda ev: any(e["type"] == "create" for e in ev))
        entry = next(e for e in events if e["type"] == "create")["entry"]
        self.assertEqual((entry["name"], entry["type"], entry["owner"]), ("e", "file", "root"))

    def test_missing_and_non_directory_paths_are_refused(self):
        self.assertFails("file_not_found", self.watch, os.path.join(self.dir, "nope"))
        open(os.path.join(self.dir, "file"), "w").close()
        self.assertFails("not_a_directory", self.watch, os.path.join(self.dir, "file"))

    def test_a_detached_watch_reports_nothing_more(self):
        sub = self.watch(self.dir)
        self.host.send_json(sub, {"op": "detach"})
        self.host.call("list")
        self.assertNotIn(sub, self.host.server.subs)


if __name__ == "__main__":
    unittest.main()
