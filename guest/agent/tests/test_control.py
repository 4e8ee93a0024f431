"""Host messages that are not execs: hello, ping, bad input, and what a new connection means."""

import json
import os
import signal
import sys
import time
import unittest

from agent_harness import AgentTestCase, main_thread_syscall, wait_for

SYS_READ = 0


class ControlMessages(AgentTestCase):
    def test_hello_echoes_nonce_with_pid_and_python_version(self):
        self.agent.send({"op": "hello", "nonce": "abc", "time_ns": time.time_ns(),
                         "seed": "ab" * 32})
        msg = self.agent.recv()
        self.assertEqual(msg["op"], "hello")
        self.assertEqual(msg["nonce"], "abc")
        self.assertEqual(msg["pid"], self.agent.proc.pid)
        self.assertEqual(msg["python"].split(".")[:2], [str(v) for v in sys.version_info[:2]])
        self.assertIs(msg["prepare_pause"], True, "hostd asks it before a pause only if so")

    def test_prepare_pause_is_answered_with_the_files_it_released(self):
        # A test agent has no writable layer to walk: it answers at once, with none
        self.agent.send({"op": "prepare_pause", "nonce": "p"})
        self.assertEqual(self.agent.recv(),
                         {"op": "prepare_pause", "nonce": "p", "released_files": 0})

    def test_a_hello_on_the_repl_port_is_echoed_with_the_workers_pid(self):
        self.agent.send_repl({"op": "hello", "nonce": "n"})
        msg = self.agent.recv_repl()
        self.assertEqual((msg["op"], msg["nonce"]), ("hello", "n"))
        self.assertEqual(msg["pid"], self.agent.worker_pid())

    # Seeded generators, after `import random; random.seed(1)`: the next random() would be
    # the first value after seed(1), unless the worker gave `random` a fresh seed
    SEEDED = "import random\nrandom.seed(1)\nfirst = random.Random(1).random()"

    def test_a_copy_gets_fresh_seeds_before_its_next_cell(self):
        self.run_ok(self.SEEDED)
        self.agent.hello(copy=True)
        self.assertEqual(self.run_ok("random.random() != first").stdout, ["True"])

    def test_a_machine_that_goes_on_keeps_the_generators_its_user_seeded(self):
        # A resume after a pause, a re-adoption after a restart: no new copy
        self.run_ok(self.SEEDED)
        self.agent.hello(copy=False)
        self.assertEqual(self.run_ok("random.random() == first").stdout, ["True"])

    def test_a_copy_whose_first_cell_comes_after_a_later_hello_still_gets_them(self):
        # A copy nobody ran a cell in before hostd restarted and re-adopted it
        self.run_ok(self.SEEDED)
        self.agent.agent_hello(copy=True)
        self.agent.hello(copy=False)
        self.assertEqual(self.run_ok("random.random() != first").stdout, ["True"])
        # ...once: later connections that are no copy leave them alone
        self.run_ok("random.seed(1)")
        self.agent.hello(copy=False)
        self.assertEqual(self.run_ok("random.random() == first").stdout, ["True"])

    def test_an_older_hosts_hello_without_copy_counts_as_a_copy(self):
        self.run_ok(self.SEEDED)
        self.agent.hello()
        self.assertEqual(self.run_ok("random.random() != first").stdout, ["True"])

    def test_a_copy_sets_numpys_global_generator_whole_from_os_urandom(self):
        # A stand-in for numpy, whose global generator pandas and scikit-learn draw from too
        self.run_ok("import sys, types\n"
                    "np = types.ModuleType('numpy')\n"
                    "np.frombuffer = lambda data, dtype: (len(data), dtype)\n"
                    "mt = types.ModuleType('numpy.random.mtrand')\n"
                    "mt.states = []\nmt.set_state = mt.states.append\n"
                    "sys.modules.update({'numpy': np, 'numpy.random.mtrand': mt})")
        self.agent.hello(copy=True)
        self.assertEqual(self.run_ok("print(mt.states)").stdout,
                         ["[('MT19937', (2496, '<u4'), 624)]"])

    def test_garbage_glued_before_a_repl_hello_is_discarded(self):
        self.agent.send_repl_raw(b'{"op":"exec","id":9,"co' + b'{"op":"hello","nonce":"r"}\n')
        self.assertEqual(self.agent.recv_repl(), {"op": "hello", "nonce": "r",
                                                  "pid": self.agent.worker_pid()})
        self.assertEqual(self.run_ok("print('ok')").stdout, ["ok"])

    def test_bad_messages_on_the_repl_port_get_errors_and_the_worker_lives_on(self):
        self.run_ok("kept = 1")
        for raw in (b'{"op":"frobnicate"}\n', b'{"op":"exec","id":"one","code":"1"}\n',
                    b'{"op":"exec","id":1}\n', b'{"op":"exec","id":1,"code":"1","env":[]}\n',
                    b'{"op":"exec","id":1,"code":"1","env":{"A":1}}\n',
                    b'{"op":"exec","id":1,"code":"1","cwd":7}\n',
                    b'{"op":"exec","id":1,"code":"1","display":"yes"}\n'):
            self.agent.send_repl_raw(raw)
            self.assertEqual(self.agent.recv_repl()["op"], "error", raw)
        self.agent.send_repl_raw(b"not json at all\n")        # noise: dropped, no answer
        self.assertEqual(self.run_ok("kept").stdout, ["1"])

    def test_a_python_exec_on_the_agent_port_is_refused(self):
        self.agent.send({"op": "exec", "id": 1, "language": "python", "code": "1"})
        msg = self.agent.recv()
        self.assertEqual(msg["op"], "error")

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
                    b'{"op":"exec","id":"one","language":"bash","code":"1"}\n',
                    b'{"op":"exec","id":1,"language":"ruby","code":"1"}\n',
                    b'{"op":"exec","id":1,"language":"bash","code":"1","env":{"A":2}}\n',
                    b'{"op":"exec","id":1,"language":"bash","code":"1","cwd":["/"]}\n',
                    b'{"op":"set_env","env":{}}\n', b'{"op":"set_env","nonce":"n","env":[]}\n',
                    b'{"op":"prepare_freeze"}\n', b'{"op":"prepare_pause","nonce":1}\n',
                    b'{"op":"cancel_all","nonce":5}\n'):
            self.agent.send_raw(raw)
            msg = self.agent.recv()
            self.assertEqual(msg["op"], "error", raw)
            self.assertIsInstance(msg["message"], str)
        self.assertEqual(self.run_ok("print('alive')").stdout, ["alive"])
        self.assertEqual(self.run_ok("echo alive", "bash").stdout, ["alive"])

    def test_cancel_of_unknown_or_finished_exec_changes_nothing(self):
        exec_id = self.agent.start("1")
        self.agent.collect(exec_id)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        self.agent.send({"op": "cancel", "id": 999, "reason": "timeout"})
        self.agent.send({"op": "ping", "nonce": "x"})
        self.assertEqual(self.agent.recv(), {"op": "pong", "nonce": "x"})
        # The idle worker will never see 999: the agent ends it (hostd ignores that exit)
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": 999, "code": 124})
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])


class Connections(AgentTestCase):
    """A hello starts a new host connection (a restore, a fork child, a restarted hostd):
    exec ids start again at 1, and nothing from before may touch what comes after."""

    def test_a_cancel_from_before_a_hello_does_not_touch_the_execs_after_it(self):
        # A fork child inherits its parent's unread cancels, and its exec ids start again
        self.run_ok("x = 1")
        self.agent.send({"op": "cancel", "id": 3, "reason": "timeout"})    # a stale race
        self.agent.hello()
        for _ in range(3):
            self.assertEqual(self.run_ok("print('ran')").stdout, ["ran"])

    def test_an_idle_worker_that_never_got_a_cancelled_exec_has_it_ended_by_the_agent(self):
        # A cancel of an id the worker never read (a bash exec that just ended, or one a dead
        # worker had read): the agent writes its exit on the REPL port; hostd ignores it or
        # needs it.
        self.run_ok("x = 1")
        self.agent.send({"op": "cancel", "id": 3, "reason": "timeout"})
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": 3, "code": 124})
        self.agent.hello()
        self.assertEqual([self.run_ok("print(%d)" % i).stdout for i in (1, 2, 3)],
                         [["1"], ["2"], ["3"]])

    def test_an_exec_sent_before_the_latest_hello_ends_without_running(self):
        # A hostd that crashed left an exec in the REPL port; the one that re-adopts the VM
        # says hello: that exec's client is gone, and the new execs must not wait behind it.
        self.run_ok("x = 1")
        self.agent.agent_hello()
        stale = self.agent.start("open('ran', 'w').close()")
        result = self.agent.collect(stale)
        self.assertEqual(result.code, 130)
        self.assertFalse(os.path.exists(self.path("ran")))
        self.agent.repl_hello()
        self.assertEqual(self.run_ok("x").stdout, ["1"])

    def test_a_worker_that_dies_before_the_repl_hello_took_nothing_of_the_new_connection(self):
        # Else hostd would end its new execs 1 and 2, still in the port, with the death code
        self.run_ok("x = 1")
        self.run_ok("x = 2")
        self.agent.agent_hello()
        worker = self.agent.worker_pid()
        wait_for(lambda: main_thread_syscall(worker) == SYS_READ, what="the worker to be idle")
        os.kill(worker, signal.SIGKILL)
        self.assertEqual(self.agent.recv_repl(),
                         {"op": "repl_died", "code": 128 + signal.SIGKILL, "upto": 0})


if __name__ == "__main__":
    unittest.main()
