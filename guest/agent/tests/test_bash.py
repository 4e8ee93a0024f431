"""bash execs (guest/PROTOCOL.md, "bash semantics")."""

import os
import signal
import unittest

from agent_harness import AgentTestCase, wait_for


def gone(pid):
    """Whether pid has exited (a zombie counts: it runs nothing)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


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
        # It ends 1 s after bash exits, long before the collect timeout and the sleep
        result = self.run_ok("sleep 60 & echo $!", "bash")
        self.kill_later(int(result.stdout[0]))
        self.assertEqual(self.run_ok("echo next", "bash").stdout, ["next"])

    def test_cancel_kills_the_whole_process_group(self):
        exec_id = self.agent.start("sleep 60 & echo $!; sleep 60; echo never", "bash")
        background = int(self.agent.recv()["data"])
        self.kill_later(background)
        self.agent.send({"op": "cancel", "id": exec_id, "reason": "client"})
        result = self.agent.collect(exec_id, "bash")
        self.assertEqual((result.code, result.stdout), (130, []))
        wait_for(lambda: gone(background), what="the background process to die")

    def test_a_cancel_of_a_queued_exec_ends_it_without_running_it(self):
        first = self.agent.start("while [ ! -e go ]; do sleep 0.01; done", "bash")
        second = self.agent.start("touch ran", "bash")
        self.agent.send({"op": "cancel", "id": second, "reason": "timeout"})
        self.assertEqual(self.agent.recv(), {"op": "out", "id": second, "stream": "stderr",
                                             "data": "hostd: execution timed out"})
        self.assertEqual(self.agent.recv(), {"op": "exit", "id": second, "code": 124})
        open(self.path("go"), "w").close()
        self.assertEqual(self.agent.collect(first, "bash").code, 0)
        self.assertFalse(os.path.exists(self.path("ran")))


if __name__ == "__main__":
    unittest.main()
