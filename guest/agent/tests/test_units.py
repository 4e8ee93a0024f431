"""The agent's pieces that need no processes: zero filling, the template file, the default
environment, MIME bundles, the thread that answers slow requests."""

import os
import queue
import tempfile
import threading
import unittest

import agent_harness  # noqa: F401  (puts the agent's modules on sys.path)
from agent import Agent
from default_env import DefaultEnvironment
from guest_system import RELEASE_MIN_BYTES, claim_upper_dir, fill_with_zeros, release_written_files
from hostd_shared_page import SharedPage
from repl_display import mime_bundle
from repl_output import Output
from template_config import load_template

MIB = 1 << 20


class SlowAnswers(unittest.TestCase):
    """prepare_freeze and prepare_pause are answered from one thread the agent keeps: hostd
    freezes a template on the prepare_freeze answer, and a thread that ended after it would end
    in every VM restored from the template, running code that none of them ran before."""

    def test_every_answer_comes_from_the_same_thread_and_it_lives_on(self):
        answers = queue.SimpleQueue()

        class Channel:
            def send_control(self, msg):
                answers.put((msg, threading.current_thread()))

        agent = Agent(Channel(), executor=None, bash=None, supervisor=None, system=False)
        for nonce in ("a", "b"):
            agent.on_prepare_pause({"op": "prepare_pause", "nonce": nonce})
        (first, thread), (second, same) = answers.get(timeout=10), answers.get(timeout=10)
        self.assertEqual((first["nonce"], second["nonce"]), ("a", "b"))
        self.assertIs(same, thread)
        self.assertTrue(thread.is_alive())


class ZeroFill(unittest.TestCase):
    def test_it_writes_zeros_until_only_the_margin_is_free(self):
        fd = os.memfd_create("test-zero")
        self.addCleanup(os.close, fd)
        free_at_start = 20 * MIB + 300 * 1024

        def free():                      # what the writes took is no longer free
            return free_at_start - os.fstat(fd).st_size
        written = fill_with_zeros(fd, free, margin=4 * MIB, chunk=MIB)
        self.assertEqual(written, 16 * MIB)
        self.assertEqual(os.pread(fd, written, 0), bytes(written))

    def test_with_no_more_than_the_margin_free_it_writes_nothing(self):
        fd = os.memfd_create("test-zero")
        self.addCleanup(os.close, fd)
        self.assertEqual(fill_with_zeros(fd, lambda: 3 * MIB, margin=4 * MIB, chunk=MIB), 0)


class WrittenFileRelease(unittest.TestCase):
    """Before a pause the agent drops the guest's cache of the writable layer's files: every
    regular file big enough to matter, through the directory fd init left open."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.fd = os.open(self.dir.name, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, self.fd)

    def write(self, path, size):
        full = os.path.join(self.dir.name, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(b"x" * size)
        return full

    def test_it_releases_big_regular_files_in_every_directory_and_skips_the_rest(self):
        self.write("root/data.bin", RELEASE_MIN_BYTES)
        self.write("root/deep/er/model.pt", 2 * RELEASE_MIN_BYTES)
        self.write("root/small.txt", 10)
        os.symlink("data.bin", os.path.join(self.dir.name, "root/link"))
        os.mkfifo(os.path.join(self.dir.name, "root/pipe"))
        self.assertEqual(release_written_files(self.fd), 2)
        with open(os.path.join(self.dir.name, "root/data.bin"), "rb") as f:
            self.assertEqual(f.read(), b"x" * RELEASE_MIN_BYTES, "dropping a cache loses no byte")

    def test_it_stops_walking_once_its_time_is_up(self):
        self.write("top.bin", RELEASE_MIN_BYTES)
        for d in ("a", "b", "c"):
            self.write(d + "/f", RELEASE_MIN_BYTES)
        # The clock moves a second per look, and it looks before each file: the top's file
        # fits in the budget, the next directory's does not
        ticks = iter(range(100))
        self.assertEqual(release_written_files(self.fd, budget_s=1.5, clock=lambda: next(ticks)), 1)

    def test_the_upper_directory_is_claimed_only_when_it_is_a_directory(self):
        claimed = claim_upper_dir(self.fd)
        self.assertEqual(claimed, self.fd)
        self.assertFalse(os.get_inheritable(self.fd), "user processes must not inherit it")
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        self.assertIsNone(claim_upper_dir(r))
        self.assertIsNone(claim_upper_dir(9999), "no fd there: no disk, or an agent test")


class TemplateFile(unittest.TestCase):
    def load(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        logged = []
        return load_template(f.name, lambda *args: logged.append(args)), logged

    def test_preload_and_env_are_read(self):
        template, logged = self.load('{"name": "python", "preload": ["numpy", "pandas"], '
                                     '"env": {"MPLBACKEND": "Agg"}}')
        self.assertEqual((template.name, template.preload, template.env),
                         ("python", ["numpy", "pandas"], {"MPLBACKEND": "Agg"}))
        self.assertEqual(logged, [])

    def test_entries_of_the_wrong_type_are_dropped_and_logged(self):
        template, logged = self.load('{"preload": ["ok", 3, ""], '
                                     '"env": {"A": "1", "B": 2, "C=D": "x"}}')
        self.assertEqual((template.preload, template.env), (["ok"], {"A": "1"}))
        self.assertEqual(len(logged), 1)

    def test_a_broken_or_missing_file_is_an_empty_template(self):
        for text in ("{broken", "[1, 2]"):
            template, logged = self.load(text)
            self.assertEqual((template.preload, template.env, len(logged)), ([], {}, 1))
        logged = []
        template = load_template("/nonexistent/template.json", lambda *a: logged.append(a))
        self.assertEqual((template.preload, template.env, len(logged)), ([], {}, 1))


class DefaultEnvironmentLayers(unittest.TestCase):
    def test_sandbox_over_services_over_template_over_base(self):
        env = DefaultEnvironment("/root", {"LANG": "C", "T": "template"})
        env.merge({"HTTP_PROXY": "http://10.0.2.2:3128", "T": "service"})
        self.assertEqual(env.current(), {
            "HOME": "/root", "LANG": "C", "PATH": env.current()["PATH"], "T": "service",
            "HTTP_PROXY": "http://10.0.2.2:3128"})
        changed, unset = env.set_sandbox({"T": "sandbox", "S": "1"})
        self.assertEqual((changed, unset), ({"T": "sandbox", "S": "1"}, []))
        changed, unset = env.set_sandbox({})
        self.assertEqual((changed, unset), ({"T": "service"}, ["S"]))

    def test_the_current_dict_is_replaced_not_changed(self):
        env = DefaultEnvironment("/root")
        before = env.current()
        env.set_sandbox({"S": "1"})
        self.assertNotIn("S", before)


class MimeBundles(unittest.TestCase):
    def test_plain_values_have_text_plain_only(self):
        for value in (1, "s", [1], {"a": 1}, None, int):
            self.assertEqual(mime_bundle(value), {"text/plain": repr(value)})

    def test_representation_values_are_normalized(self):
        class Odd:
            def _repr_png_(self):
                return (b"png", {"width": 3})        # (data, metadata)
            def _repr_html_(self):
                return b"<b>bytes</b>"
            def _repr_json_(self):
                return object()                       # not JSON: left out
            def _repr_markdown_(self):
                return None                           # not available

        self.assertEqual(sorted(mime_bundle(Odd()).items())[:2],
                         [("image/png", "cG5n"), ("text/html", "<b>bytes</b>")])
        self.assertEqual(sorted(mime_bundle(Odd())), ["image/png", "text/html", "text/plain"])

    def test_a_mimebundle_method_is_used_too(self):
        class Chart:
            def _repr_mimebundle_(self, include=None, exclude=None):
                return {"application/vnd.chart+json": {"x": 1}, "text/plain": "ignored"}

        bundle = mime_bundle(Chart())
        self.assertEqual(bundle["application/vnd.chart+json"], {"x": 1})
        self.assertTrue(bundle["text/plain"].startswith("<"))


class SharedPageOutbox(unittest.TestCase):
    def test_what_a_dead_worker_left_ends_with_a_newline(self):
        page = SharedPage()
        self.addCleanup(os.close, page.fd)
        page.outbox[:5] = b'{"op"'
        page.outlen = 5
        self.assertEqual(page.take_outbox(), b'{"op"\n')
        self.assertEqual((page.outlen, page.take_outbox()), (0, b"\n"))


class OutputFlushDeadline(unittest.TestCase):
    """A cell that ends at once sends its output with its exit; the worker's io thread, which
    flushes what a still-running cell printed (FLUSH_DELAY after its first output, a timer it
    polls), is not woken for it: under TCG each wake-up is emulated guest work
    (docs/architecture.md, "Exec latency on a slow TCG host"). Checked on the mechanism, not by
    counting the thread's switches over real execs, which a loaded host stretches past the
    deadline."""

    def setUp(self):
        page = SharedPage()
        self.addCleanup(os.close, page.fd)
        port_r, port_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for fd in (port_r, port_w, out_r, out_w, err_r, err_w):
            self.addCleanup(os.close, fd)
        self.port_r = port_r
        self.output = Output(port_w, page, {"stdout": out_r, "stderr": err_r}, lambda _: None)
        self.addCleanup(os.close, self.output.wake_r)
        self.addCleanup(os.close, self.output.wake_w)
        if self.output.timer is None:
            self.skipTest("no timerfd here: the io thread is woken instead, by design")
        self.addCleanup(os.close, self.output.timer.fd)

    def io_thread_woken(self):
        try:
            return os.read(self.output.wake_r, 64) != b""
        except BlockingIOError:
            return False

    def test_a_quick_exec_arms_a_timer_and_wakes_nobody(self):
        output = self.output
        with output.lock:
            output.arm(1)
            output.feed("stdout", b"0\n")
            self.assertTrue(output.timer.armed, "the first output starts the deadline")
            self.assertFalse(self.io_thread_woken())
            output.end(1, 0)
        self.assertFalse(output.timer.armed, "the exit's write ends the deadline")
        self.assertFalse(self.io_thread_woken())
        self.assertEqual(os.read(self.port_r, 4096),
                         b'{"op":"out","id":1,"stream":"stdout","data":"0"}\n'
                         b'{"op":"exit","id":1,"code":0}\n')


if __name__ == "__main__":
    unittest.main()
