"""Cancelling execs: one (cancel) or all of them (cancel_all)."""

import glob
import os
import signal
import unittest

from agent_harness import NOTICE, TIMED_OUT, AgentTestCase, wait_for
from worker_supervisor import CANCEL_GRACE, ESCALATE_TICK, Supervisor

SYS_WRITE = 1


def blocked_writing(pid):
    """Whether a thread of pid is blocked in write() (its output backpressured)."""
    for path in glob.glob("/proc/%d/task/*/syscall" % pid):
        try:
            with open(path) as f:
                if f.read().split()[0] == str(SYS_WRITE):
                    return True
        except (OSError, IndexError):
            pass
    return False


class Cancel(AgentTestCase):
    def test_timeout_cancel_interrupts_keeps_state_and_exits_124(self):
        self.run_ok("x = 'kept'")
        exec_id = self.agent.start("import time\nprint('started', flush=True)\ntime.sleep(30)")
        self.assertEqual(self.agent.recv_repl()["data"], "started")
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        result = self.agent.collect(exec_id)
        self.assertEqual(result.code, 124)
        self.assertEqual(result.stderr, [TIMED_OUT])
        self.assertEqual(self.run_ok("x").stdout, ["'kept'"])   # same worker, no notice

    def test_client_cancel_exits_130_without_the_timeout_line(self):
        exec_id = self.agent.start("import time\ntime.sleep(30)")
        # Sent at once: it may well arrive before the cell has started
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id)
        self.assertEqual((result.code, result.stderr), (130, []))
        self.assertEqual(self.run_ok("print(1)").stderr, [])

    def test_cancel_of_a_loop_that_swallows_keyboard_interrupt_restarts_the_worker(self):
        self.run_ok("state = 1")
        exec_id = self.agent.start("import time\nwhile True:\n    try:\n"
                                   "        print('in the loop', flush=True)\n"
                                   "        time.sleep(10)\n"
                                   "    except KeyboardInterrupt:\n        pass")
        self.agent.recv_repl()
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        result = self.agent.collect(exec_id)
        self.assertEqual(result.code, 124)
        self.assertEqual(result.stderr, [TIMED_OUT])
        # SIGINT first: the loop swallowed it and went round again before the SIGKILL
        self.assertIn("in the loop", result.stdout)
        result = self.agent.run("state")
        self.assertEqual(result.stderr[0], NOTICE % (128 + signal.SIGKILL))
        self.assertEqual(result.stderr[-1], "NameError: name 'state' is not defined")

    def test_infinite_output_is_cancellable(self):
        exec_id = self.agent.start("while True:\n    print('x' * 1000)")
        for _ in range(100):
            self.assertEqual(self.agent.recv_repl()["data"], "x" * 1000)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id)
        self.assertEqual(result.code, 130)
        self.assertTrue(all(line.strip("x") == "" for line in result.stdout))
        self.assertEqual(self.run_ok("print('after')").stdout, ["after"])

    def test_backpressure_bounds_memory_and_cancel_still_works(self):
        self.run_ok("kept = True")
        worker = self.agent.worker_pid()
        rss_before = self.agent.rss_kib(worker)
        exec_id = self.agent.start("while True:\n    print('x' * 1000)")
        self.agent.recv_repl()                              # output is flowing
        wait_for(lambda: blocked_writing(worker), what="the worker blocked on its port")
        # It blocks instead of keeping what the host does not read
        self.assertLess(self.agent.rss_kib(worker) - rss_before, 4096,
                        "worker memory grew before it blocked")
        # The cancel is read and acted on although the worker cannot write (that the time it
        # spends blocked does not count towards the escalation: EscalationClock below)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "timeout"})
        result = self.agent.collect(exec_id)
        self.assertEqual(result.code, 124)
        self.assertEqual(result.stderr, [TIMED_OUT])
        self.assertEqual(self.run_ok("kept").stdout, ["True"])   # interrupted, not killed


class FakeWorker:
    """What the escalation asks of a worker: is the exec over, what is it doing; kill it."""

    def __init__(self):
        self.doing = "busy"
        self.killed = False

    def cancel(self, key, reason):
        pass

    def finished(self, key):
        return self.killed

    def activity(self):
        return self.doing

    def kill(self):
        self.killed = True


class EscalationClock(unittest.TestCase):
    """The SIGINT -> SIGKILL escalation of a Python cancel, tick by tick (no time passes): only
    the ticks in which the worker runs count towards CANCEL_GRACE."""

    def setUp(self):
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        self.ticks = []
        self.worker = FakeWorker()
        self.supervisor = Supervisor(None, None, (r, w), None, "/", [], lambda *a: None)
        self.addCleanup(os.close, self.supervisor.log_fd)
        self.supervisor.worker = self.worker
        self.supervisor._escalate_later = self.ticks.append     # armed ticks, run by tick()
        self.supervisor.cancel(1, "timeout")

    def tick(self, n):
        for _ in range(n):
            self.supervisor._escalate(self.ticks.pop())

    def test_a_worker_that_goes_on_running_is_killed_after_the_grace(self):
        grace = round(CANCEL_GRACE / ESCALATE_TICK)
        self.tick(grace - 1)
        self.assertFalse(self.worker.killed)
        self.tick(1)
        self.assertTrue(self.worker.killed)
        self.assertEqual(self.ticks, [], "nothing left to watch")

    def test_time_blocked_writing_to_a_host_that_does_not_read_does_not_count(self):
        grace = round(CANCEL_GRACE / ESCALATE_TICK)
        self.tick(grace - 1)
        self.worker.doing = "writing"
        self.tick(10 * grace)
        self.assertFalse(self.worker.killed)
        self.worker.doing = "busy"
        self.tick(1)
        self.assertTrue(self.worker.killed)

    def test_an_exec_that_ends_stops_the_watch(self):
        self.tick(1)
        self.worker.killed = True                          # finished(), for the fake
        self.tick(1)
        self.assertEqual(self.ticks, [])


class CancelAll(AgentTestCase):
    """What hostd sends when it re-adopts a VM after it crashed: the clients of every exec
    that runs or waits are gone, and the next exec must not wait behind them."""

    def test_it_ends_running_and_queued_bash_execs_and_answers_after_their_exits(self):
        running = self.agent.start("echo started; sleep 60", "bash")
        queued = self.agent.start("touch ran", "bash")
        self.assertEqual(self.agent.recv()["data"], "started")
        self.agent.send({"op": "cancel_all", "nonce": "c"})
        messages = [self.agent.recv() for _ in range(3)]
        self.assertEqual(messages, [{"op": "exit", "id": queued, "code": 130},
                                    {"op": "exit", "id": running, "code": 130},
                                    {"op": "cancel_all", "nonce": "c"}])
        self.assertEqual(self.run_ok("echo next", "bash").stdout, ["next"])

    def test_it_interrupts_the_running_python_exec_of_the_previous_connection(self):
        self.run_ok("kept = 'state'")
        old = self.agent.start("import time\nprint('running', flush=True)\ntime.sleep(60)")
        self.assertEqual(self.agent.recv_repl()["data"], "running")
        self.agent.agent_hello()                        # the new hostd
        self.assertEqual(self.agent.request({"op": "cancel_all", "nonce": "c"}),
                         {"op": "cancel_all", "nonce": "c"})
        # The old exec ends before the REPL hello's echo (hostd drops that part)
        self.assertEqual(self.agent.repl_hello()[-1], {"op": "exit", "id": old, "code": 130})
        self.assertEqual(self.run_ok("kept").stdout, ["'state'"])   # interrupted, not killed

    def test_with_nothing_running_it_just_answers(self):
        self.assertEqual(self.agent.request({"op": "cancel_all", "nonce": "n"}),
                         {"op": "cancel_all", "nonce": "n"})
        self.assertEqual(self.run_ok("print('ok')").stdout, ["ok"])


if __name__ == "__main__":
    unittest.main()
