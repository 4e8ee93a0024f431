"""Top-level `await` in cells, on the REPL's one persistent event loop."""

import os
import unittest

from agent_harness import AgentTestCase, wait_for
from test_python import frame_files

TICKER = """import asyncio
ticks = []
async def ticker():
    while True:
        ticks.append(1)
        if len(ticks) == 5:
            open('ticked', 'w').close()
        await asyncio.sleep(0.01)
task = asyncio.get_running_loop().create_task(ticker())
await asyncio.sleep(0)"""


class TopLevelAwait(AgentTestCase):
    def test_a_cell_can_await_and_its_last_expression_is_echoed(self):
        self.assertEqual(self.run_ok("import asyncio\nawait asyncio.sleep(0)\n'done'").stdout,
                         ["'done'"])
        self.assertEqual(self.run_ok("await asyncio.sleep(0, result=7)").stdout, ["7"])
        self.assertEqual(self.run_ok("[await asyncio.sleep(0, result=i) for i in (1, 2)]")
                         .stdout, ["[1, 2]"])

    def test_tasks_live_on_between_cells_and_run_while_the_repl_waits(self):
        self.run_ok(TICKER)
        wait_for(lambda: os.path.exists(self.path("ticked")), what="the task to run on")
        self.assertEqual(self.run_ok("task.done(), len(ticks) >= 5").stdout, ["(False, True)"])
        self.assertEqual(self.run_ok("task.cancel()\nawait asyncio.sleep(0)\ntask.cancelled()")
                         .stdout, ["True"])

    def test_a_repl_running_tasks_between_cells_counts_as_idle_for_a_stray_cancel(self):
        # A cancel of an exec the worker never got (see test_control): the agent ends it
        # itself, instead of killing a worker it would take for busy
        self.run_ok(TICKER)
        self.agent.send({"op": "cancel", "id": 99, "reason": "client"})
        self.assertEqual(self.agent.recv_repl(), {"op": "exit", "id": 99, "code": 130})
        self.assertEqual(self.run_ok("task.done(), len(ticks) > 0").stdout, ["(False, True)"])

    def test_a_cancel_interrupts_an_awaiting_cell_and_ends_its_coroutine(self):
        exec_id = self.agent.start("import asyncio\nprint('waiting', flush=True)\n"
                                   "await asyncio.sleep(30)\nprint('never')")
        self.assertEqual(self.agent.recv_repl()["data"], "waiting")
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        self.assertEqual(self.agent.collect(exec_id).code, 130)
        # The loop still works, and the interrupted cell is not one of its tasks any more
        result = self.run_ok("await asyncio.sleep(0)\nlen(asyncio.all_tasks()) - 1")
        self.assertEqual(result.stdout, ["0"])

    def test_an_exception_in_an_awaiting_cell_shows_only_the_cells_frames(self):
        result = self.agent.run("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n"
                                "    raise ValueError('bad')\nawait f()")
        self.assertEqual(result.code, 1)
        self.assertEqual(result.stderr[-1], "ValueError: bad")
        self.assertEqual(frame_files(result.stderr), ["<exec-1>", "<exec-1>"])

    def test_sys_exit_in_an_awaiting_cell_sets_the_code(self):
        self.assertEqual(self.agent.run("import asyncio, sys\nawait asyncio.sleep(0)\n"
                                        "sys.exit(4)").code, 4)
        self.assertEqual(self.run_ok("await asyncio.sleep(0, result='alive')").stdout,
                         ["'alive'"])

    def test_cells_without_await_never_start_the_event_loop(self):
        self.assertEqual(self.run_ok("import sys\n'asyncio' in sys.modules").stdout, ["False"])


if __name__ == "__main__":
    unittest.main()
