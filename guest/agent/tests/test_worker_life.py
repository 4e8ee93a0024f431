"""The REPL worker's death and replacement, as the agent supervises it."""

import os
import shutil
import signal
import tempfile
import unittest

from agent_harness import NOTICE, AgentProcess, AgentTestCase, main_thread_syscall, wait_for

SYS_READ = 0


def processes_in(directory):
    """Pids of the live processes whose working directory is `directory`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink("/proc/%s/cwd" % entry) == directory:
                    found.append(int(entry))
            except OSError:
                pass
    return found


class WorkerLife(AgentTestCase):
    def test_worker_death_reports_its_code_then_a_fresh_worker_starts_with_a_notice(self):
        self.run_ok("x = 1")
        result = self.agent.run("import os\nprint('bye', flush=True)\nos._exit(3)")
        self.assertEqual((result.stdout, result.code), (["bye"], 3))
        result = self.agent.run("print('fresh')\nx")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stdout, ["fresh"])
        self.assertEqual(result.stderr[0], NOTICE % 3)
        self.assertEqual(result.stderr[-1], "NameError: name 'x' is not defined")

    def test_worker_killed_by_signal_reports_128_plus_signal(self):
        result = self.agent.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual(result.code, 128 + signal.SIGKILL)
        self.assertEqual(self.agent.run("1").stderr, [NOTICE % (128 + signal.SIGKILL)])

    def test_a_worker_the_oom_killer_takes_mid_allocation_ends_its_exec_with_137_by_itself(self):
        # The kernel's OOM killer sends SIGKILL from outside, while the cell allocates; the
        # exec ends with nothing more from the host (no later request to wake anything up)
        exec_id = self.agent.start("print('allocating', flush=True)\n"
                                   "while True:\n    bytearray(1 << 20)")
        self.assertEqual(self.agent.recv_repl()["data"], "allocating")
        os.kill(self.agent.worker_pid(), signal.SIGKILL)
        # A kill between the worker's write and its outbox length's update makes the agent send
        # that line again (repl_output.py, flush): at least once, never lost.
        msg = self.agent.recv_repl()
        while msg.get("op") == "out" and msg.get("data") == "allocating":
            msg = self.agent.recv_repl()
        self.assertEqual(msg, {"op": "exit", "id": exec_id, "code": 137})
        self.assertEqual(self.agent.recv_repl(), {"op": "repl_died", "code": 137, "upto": exec_id})
        self.assertEqual(self.agent.run("print('fresh')").stdout, ["fresh"])

    def test_output_printed_just_before_a_crash_is_not_lost(self):
        # Printed lines wait in the page the worker shares with the agent, not in the worker
        result = self.agent.run("import os, signal\nprint('last words')\n"
                                "os.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual((result.stdout, result.code), (["last words"], 128 + signal.SIGKILL))

    def test_the_agent_says_when_the_worker_died(self):
        exec_id = self.agent.start("import os\nos._exit(5)")
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": exec_id, "code": 5})
        self.assertEqual(self.agent.recv_repl(), {"op": "repl_died", "code": 5, "upto": exec_id})

    def test_the_worker_dies_with_the_agent(self):
        # Else it would keep the REPL port open, and a restarted agent could not open it
        worker = self.agent.worker_pid()
        os.kill(self.agent.proc.pid, signal.SIGKILL)
        self.agent.proc.wait()

        def dead():
            try:
                with open("/proc/%d/stat" % worker) as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "Z"   # not yet reaped
            except FileNotFoundError:
                return True
        wait_for(dead, 5, "the worker to die with the agent")

    def test_an_agent_that_exits_while_starting_its_worker_leaves_none_behind(self):
        # The agent may exit while its worker is being started, before that worker has
        # asked to die with it: the worker must notice. An orphan is no longer the agent's
        # descendant; it is found by its working directory.
        for _ in range(5):
            workdir = tempfile.mkdtemp(prefix="hostd-agent-test-", dir=self.workdir)
            agent = AgentProcess(os.path.realpath(workdir))
            agent.close()
            wait_for(lambda: not processes_in(os.path.realpath(workdir)), 10,
                     "no process left in " + workdir)

    def test_a_cancelled_exec_behind_a_wedged_worker_ends_and_the_worker_is_replaced(self):
        # A thread of user code holds the GIL in C code: the worker cannot even read exec 2
        self.run_ok("import os, threading, time\ndef wedge():\n"
                    "    while not os.path.exists('wedge'):\n        time.sleep(0.01)\n"
                    "    open('wedged', 'w').close()\n    10 ** 10 ** 9\n"
                    "threading.Thread(target=wedge, daemon=True).start()")
        worker = self.agent.worker_pid()
        wait_for(lambda: main_thread_syscall(worker) == SYS_READ, what="the worker to be idle")
        open(self.path("wedge"), "w").close()
        wait_for(lambda: os.path.exists(self.path("wedged")), what="the GIL to be taken")
        exec_id = self.agent.start("print('never')")
        # Its main thread got the exec's bytes and waits for the GIL: not reading any more
        wait_for(lambda: main_thread_syscall(worker) not in (None, SYS_READ),
                 what="the worker's main thread to leave read()")
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        msgs = [self.agent.recv_repl()]
        while msgs[-1]["op"] != "repl_died":
            msgs.append(self.agent.recv_repl())
        self.assertEqual(msgs[-1]["code"], 128 + signal.SIGKILL)
        # The host ends it from repl_died: it had cancelled it (guest/PROTOCOL.md). The dead
        # worker may or may not have taken it from the port; if not, the fresh one ends it
        # without running it, and what it says about it is for nobody.
        fresh = self.agent.start("print('fresh')")
        result = self.agent.collect(fresh, ignore=(exec_id,))
        self.assertEqual(result.stdout, ["fresh"])
        self.assertEqual(result.stderr, [NOTICE % (128 + signal.SIGKILL)])
        self.assertNotIn("never", [m.get("data") for m in msgs])

    def test_a_cancelled_exec_still_in_the_port_of_a_dead_worker_never_runs(self):
        # Deterministically the case the test above may meet: the worker dies with an exec it
        # has not read, which was cancelled meanwhile.
        blocked = self.agent.start("import os, time\nprint('running', flush=True)\n"
                                   "while not os.path.exists('go'):\n"
                                   "    time.sleep(0.01)\nos._exit(3)")
        self.assertEqual(self.agent.recv_repl()["data"], "running")
        queued = self.agent.start("open('ran', 'w').close()")   # the worker reads it no more
        self.agent.send({"op": "cancel", "id": queued, "reason": "timeout"})
        open(self.path("go"), "w").close()
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": blocked, "code": 3})
        self.assertEqual(self.agent.recv_repl(), {"op": "repl_died", "code": 3, "upto": blocked})
        # hostd ends `queued` now (it cancelled it); the fresh worker ends it unrun
        self.assertEqual(self.agent.collect(queued).stderr, ["hostd: execution timed out"])
        self.assertFalse(os.path.exists(self.path("ran")))
        result = self.agent.run("print('fresh')")
        self.assertEqual((result.stdout, result.stderr), (["fresh"], [NOTICE % 3]))

    def test_a_cancel_that_comes_while_there_is_no_worker_is_answered_by_the_next_one(self):
        # Between a worker's death and its successor's start (held off here: it cannot start
        # in a working directory that is gone) no worker can be told of a cancel. One of an
        # exec no worker will ever see (a bash exec that just ended, a Python one the dead
        # worker had read) must still end once the next worker is there and idle, as it does
        # when a worker was there all along: hostd, which had not cancelled it yet when it
        # heard of the death, waits for that exit. (An agent's first worker, until the agent
        # has noted it, is the same case: test_control's cancel of an unknown exec met it
        # under load, when that worker ran the test's first exec before it was noted.)
        self.run_ok("x = 1")
        worker = self.agent.worker_pid()
        # Killed once back in read(): not between its write of the exit and its outbox's
        # update, which would make the agent send that exit again (repl_output.py, flush)
        wait_for(lambda: main_thread_syscall(worker) == SYS_READ, what="the worker to be idle")
        away = self.workdir + ".away"
        os.rename(self.workdir, away)
        self.addCleanup(shutil.rmtree, away, True)
        os.kill(worker, signal.SIGKILL)
        self.assertEqual(self.agent.recv_repl(),
                         {"op": "repl_died", "code": 128 + signal.SIGKILL, "upto": 1})
        self.agent.send({"op": "cancel", "id": 7, "reason": "timeout"})
        self.agent.send({"op": "ping", "nonce": "read"})
        self.assertEqual(self.agent.recv(), {"op": "pong", "nonce": "read"})   # ...the cancel
        os.rename(away, self.workdir)
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": 7, "code": 124})
        result = self.agent.run("print('fresh')")
        self.assertEqual((result.stdout, result.stderr),
                         (["fresh"], [NOTICE % (128 + signal.SIGKILL)]))


if __name__ == "__main__":
    unittest.main()
