"""The groups that keep user code from starving the agent (cgroups.py), set up in a fake
cgroup and proc tree: what the agent writes where, and the memory cap it computes."""

import os
import shutil
import tempfile
import unittest

import agent_harness  # noqa: F401  (puts the agent's modules on sys.path)
from cgroups import HEADROOM, MAX_PROCESSES, Cgroups, user_memory_cap

MIB = 1 << 20
MEMINFO = "MemTotal:         996756 kB\nMemFree:          884616 kB\nMemAvailable:     908784 kB\n"


class FakeTree:
    """A cgroup2 root and a proc tree as the agent finds them at its start in a VM."""

    def __init__(self, own_cgroup="/agent"):
        self.dir = tempfile.mkdtemp(prefix="hostd-cgroups-test-")
        self.root = os.path.join(self.dir, "cgroup")
        self.proc = os.path.join(self.dir, "proc")
        os.makedirs(os.path.join(self.root, "agent"))
        os.makedirs(os.path.join(self.proc, "self"))
        self.write("cgroup/cgroup.procs", "")
        self.write("proc/meminfo", MEMINFO)
        self.write("proc/self/cgroup", "0::%s\n" % own_cgroup)
        self.write("proc/self/oom_score_adj", "0")
        self.logged = []

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def read(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def cgroups(self):
        return Cgroups(True, self.logged.append, root=self.root, proc=self.proc)


class UserMemoryCap(unittest.TestCase):
    def test_it_leaves_what_the_kernel_and_agent_hold_and_room_for_them_to_grow(self):
        # Figures of a 1 GiB sandbox
        total, available = 996756 * 1024, 908784 * 1024
        cap = user_memory_cap({"MemTotal": total, "MemAvailable": available})
        self.assertEqual(total - cap, (total - available) + HEADROOM)

    def test_it_is_never_negative(self):
        self.assertEqual(user_memory_cap({"MemTotal": 64 * MIB, "MemAvailable": 8 * MIB}), 0)


class SetUp(unittest.TestCase):
    def setUp(self):
        self.tree = FakeTree()
        self.addCleanup(shutil.rmtree, self.tree.dir, True)

    def test_user_code_is_capped_and_weighs_less_than_the_agent(self):
        self.tree.cgroups()
        t = self.tree
        self.assertEqual(t.read("cgroup/sandbox/pids.max"), str(MAX_PROCESSES))
        cap = 908784 * 1024 - HEADROOM
        self.assertEqual(t.read("cgroup/sandbox/memory.max"), str(cap))
        self.assertGreater(int(t.read("cgroup/agent/cpu.weight")),
                           int(t.read("cgroup/sandbox/cpu.weight")))
        # Everything user code may not have is the agent's, and the kernel never reclaims it
        self.assertEqual(t.read("cgroup/agent/memory.min"), str(996756 * 1024 - cap))
        self.assertEqual(t.read("proc/self/oom_score_adj"), "-1000")
        self.assertTrue(os.path.isdir(os.path.join(t.root, "sandbox", "repl")))
        self.assertEqual(t.logged, [])

    def test_an_agent_that_pid_1_restarted_keeps_the_cap_of_the_first(self):
        self.tree.cgroups()
        # User code now holds memory, which the restarted agent must not take for the kernel's
        self.tree.write("proc/meminfo", MEMINFO.replace("908784", "108784"))
        self.tree.cgroups()
        self.assertEqual(self.tree.read("cgroup/sandbox/memory.max"),
                         str(908784 * 1024 - HEADROOM))

    def test_an_agent_left_in_the_root_group_moves_into_its_own(self):
        tree = FakeTree(own_cgroup="/")
        self.addCleanup(shutil.rmtree, tree.dir, True)
        tree.cgroups()
        self.assertEqual(tree.read("cgroup/agent/cgroup.procs"), str(os.getpid()))
        self.assertEqual(tree.read("cgroup/agent/cpu.weight"), "1000")

    def test_a_cancel_kills_the_group_without_starting_anything(self):
        cgroups = self.tree.cgroups()
        cgroups.make("exec-7")
        cgroups.kill("exec-7")
        self.assertEqual(self.tree.read("cgroup/sandbox/exec-7/cgroup.kill"), "1")

    def test_without_cgroup2_everything_is_a_no_op(self):
        os.remove(os.path.join(self.tree.root, "cgroup.procs"))
        cgroups = self.tree.cgroups()
        self.assertFalse(cgroups.enabled)
        self.assertFalse(os.path.exists(os.path.join(self.tree.root, "sandbox")))
        self.assertIsNone(cgroups.joiner("repl"))


if __name__ == "__main__":
    unittest.main()


class CleanUp(unittest.TestCase):
    """The process manager's groups (proc_manager.py) are removed once their processes exited."""

    def setUp(self):
        self.tree = FakeTree()
        self.addCleanup(shutil.rmtree, self.tree.dir, True)

    def test_remove_and_sweep_prefix_remove_empty_groups_but_those_kept(self):
        cgroups = self.tree.cgroups()
        sandbox = os.path.join(self.tree.root, "sandbox")
        for name in ("proc-1", "proc-2", "proc-3"):
            os.mkdir(os.path.join(sandbox, name))
        cgroups.remove("proc-1")
        cgroups.sweep_prefix("proc-", keep={"proc-3"})
        self.assertEqual(sorted(n for n in os.listdir(sandbox) if n.startswith("proc-")),
                         ["proc-3"])
