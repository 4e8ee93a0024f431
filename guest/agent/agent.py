#!/usr/bin/env python3
"""hostd guest agent: the process hostd talks to inside a VM (guest/PROTOCOL.md).

Speaks the newline-delimited JSON protocol on the virtio-serial port named "hostd.agent" (or
on stdin/stdout with --stdio, for tests): hello, ping, cancel, bash execs, the sandbox's
default environment, preparing a template for freezing, cancelling everything. Python execs go
to the persistent REPL worker (repl_worker.py) on its own port, "hostd.repl", and never through
this process; the agent supervises the worker (worker_supervisor.py).
Standard library only; Python 3.9+.

Threads, and why there are these:
  main      reads the channel and handles every host message. It never writes the channel
            itself (but for the hello reply, see on_hello), so a cancel is always acted on,
            even while output is backpressured.
  executor  one selector loop (executor.py): runs bash execs (bash_runner.py), turns their
            output into `out` messages, watches the worker's exit. It writes the channel, so
            when the host stops reading it blocks, and so do the producers: bounded memory.
  control   writes the main thread's replies (error, set_env, ...) so that they never make the
            main thread wait behind backpressured output (host_channel.py).
  chores    runs prepare_freeze and prepare_pause, which take seconds, and sends their answers.
            It lives as long as the agent: hostd freezes a template on the prepare_freeze
            answer, and a thread that ended after it would end in every VM restored from it.
(Plus short-lived ones: a timer per Python cancel, for the SIGINT -> SIGKILL escalation.)
"""

import argparse
import gc
import os
import queue
import sys
import threading
import traceback

import cpu_quirks
import files_server
import guest_system
import net_relay
import proc_server
from bash_runner import BashRunner, Exec
from cgroups import Cgroups
from default_env import DefaultEnvironment, invalid_entry
from executor import Executor
from host_channel import Channel, open_port
from hostd_wire import MAX_INPUT_LINE, encode, parse_hello_fast, parse_line, read_lines
from template_config import DEFAULT_PATH, load_template
from worker_supervisor import Supervisor

PORT_NAME = "hostd.agent"
REPL_PORT_NAME = "hostd.repl"
PYTHON_VERSION = "%d.%d.%d" % sys.version_info[:3]
READY_TIMEOUT = 600.0       # prepare_freeze: how long the worker's preloads may take (TCG)
CANCEL_REASONS = ("timeout", "client", "shutdown")


def log(*args):
    print("hostd-agent:", *args, file=sys.stderr, flush=True)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_env(value):
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items())


class Agent:
    def __init__(self, channel, executor, bash, supervisor, system):
        self.channel, self.executor = channel, executor
        self.bash, self.supervisor = bash, supervisor
        self.system = system        # set the clock, reseed the RNG, zero memory: only in a VM
        self.upper_fd = guest_system.claim_upper_dir() if system else None
        self.chores = queue.SimpleQueue()
        self.pings, self.pings_lock = [], threading.Lock()   # nonces the executor will answer
        # The hello reply's middle, fixed for the agent's life (a fork child keeps its pid)
        self._hello_tail = ('","pid":%d,"python":"%s","net":' % (os.getpid(),
                                                                  PYTHON_VERSION)).encode()
        threading.Thread(target=self._run_chores, name="chores", daemon=True).start()

    def serve(self, rfd, stdio):
        self.executor.start()
        self.supervisor.start()
        read_lines(rfd, self.handle_line, log, stop_at_eof=stdio, on_oversized=lambda: self.error(
            "line longer than %d bytes dropped" % MAX_INPUT_LINE), wait_in_poll=True)
        self.shutdown()

    def handle_line(self, line):
        try:
            # The hello first, in as little distinct code as can be (see on_fast_hello)
            if line.startswith(b'{"op":"hello",'):
                fast = parse_hello_fast(line)
                if fast is not None:
                    return self.on_fast_hello(*fast)
            self._handle_line(line)
        except Exception as e:           # a bug must not take the agent down
            log("internal error:\n" + traceback.format_exc())
            self.error("internal error: %s" % e)

    def _handle_line(self, line):
        if not line.strip():
            return
        msg = parse_line(line)
        if msg is None:
            return self.error("malformed message: %r" % line[:200])
        name = self.HANDLERS.get(msg.get("op")) if isinstance(msg.get("op"), str) else None
        if name is None:
            return self.error("unknown op %r" % (msg.get("op"),))
        getattr(self, name)(msg)

    HANDLERS = {"hello": "on_hello", "exec": "on_exec", "cancel": "on_cancel", "ping": "on_ping",
                "set_env": "on_set_env", "prepare_freeze": "on_prepare_freeze",
                "prepare_pause": "on_prepare_pause", "cancel_all": "on_cancel_all"}

    def error(self, message):
        self.channel.send_control({"op": "error", "message": message})

    def on_ping(self, msg):
        # Answered by the executor, after what it has queued: a pong then says both that this
        # thread reads the port and that the thread which ends execs runs (hostd asks when a
        # cancel takes long: slow, or wedged?). At most one job waits for it: a host that
        # floods pings and never reads loses pongs, not our memory.
        with self.pings_lock:
            first = not self.pings
            if len(self.pings) < 10000:
                self.pings.append(msg.get("nonce"))
        if first:
            self.executor.post(self._answer_pings)

    def _answer_pings(self):
        with self.pings_lock:
            nonces, self.pings = self.pings, []
        for nonce in nonces:
            self.executor.emit({"op": "pong", "nonce": nonce})

    def on_hello(self, msg):
        """A hello in any other shape than hostd's own (an older or a test host, a nonce that
        JSON must escape, a hello glued behind garbage): the general path, same effects as
        on_fast_hello."""
        nonce = msg.get("nonce")
        if not isinstance(nonce, str):
            return self.error("hello: nonce must be a string")
        if self.system:
            guest_system.set_clock(msg.get("time_ns"), log)
            guest_system.reseed_kernel(msg.get("seed"), log)
        self._new_connection(copy=msg.get("copy") is not False)
        net = net_relay.quiet_state()
        self.channel.write([encode({"op": "hello", "nonce": nonce, "pid": os.getpid(),
                                    "python": PYTHON_VERSION, "net": net,
                                    "prepare_pause": True})])

    def on_fast_hello(self, nonce, time_ns, seed, copy):
        """hostd's hello as it sends it (hostd_wire.parse_hello_fast): the clock, the kernel RNG
        and the copy count exactly as on_hello, the reply built from bytes. Under TCG a fork
        child translates anew every guest block it runs between its restore and this answer
        (docs/architecture.md, "Where a fork child's time goes"): JSON's Python and C code, a
        dict of bound methods per line and an encoder made per reply were ~1,000 of them.
        Still before anything else runs: the clock and the RNG are set before the answer, and
        hostd sends no exec before it."""
        if self.system:
            guest_system.set_clock(time_ns, log)
            guest_system.reseed_kernel_raw(seed, log)
        self._new_connection(copy)
        self.channel.write([b'{"op":"hello","nonce":"', nonce, self._hello_tail,
                            net_relay.quiet_state_json(), b',"prepare_pause":true}\n'])

    def _new_connection(self, copy):
        # A copy (absent from an older hostd's hello, which always meant one) shares its
        # Python-level generators with its siblings; a VM that goes on (resumed, re-adopted)
        # keeps them, seeded as its user left them. The worker reads the count at its next
        # REPL hello: nothing wakes it now.
        self.supervisor.on_hello(copy=copy)
        # A new host connection: the processes port's streams were the old one's
        proc_server.host_changed()
        # The answer is written from this thread, not through the control writer: a hello
        # comes right after a restore, when nothing else writes and the host reads, and a
        # thread hand-off costs a fork child CPU before it can answer (docs/architecture.md,
        # "Measured choices in the code").

    def on_exec(self, msg):
        exec_id, language, code = msg.get("id"), msg.get("language"), msg.get("code")
        env, cwd = msg.get("env"), msg.get("cwd")
        if language == "python":
            return self.error("Python execs go to the %s port" % REPL_PORT_NAME)
        if (not is_int(exec_id) or language != "bash" or not isinstance(code, str)
                or not (env is None or is_env(env)) or not (cwd is None or isinstance(cwd, str))):
            return self.error("exec needs an int id, language bash and a string code; env "
                              "(object of strings) and cwd (string) are optional")
        self.bash.submit(Exec(exec_id, code, env, cwd))

    def on_cancel(self, msg):
        exec_id, reason = msg.get("id"), msg.get("reason", "client")
        if not is_int(exec_id) or reason not in CANCEL_REASONS:
            return self.error("cancel needs an int id and reason timeout|client|shutdown")
        if not self.bash.cancel(exec_id, reason):
            # Not a bash exec: a Python one, running in the worker or about to (the agent
            # never sees those), or one that is over, which the worker ignores.
            self.supervisor.cancel(exec_id, reason)

    def on_set_env(self, msg):
        nonce, env = msg.get("nonce"), msg.get("env")
        if not isinstance(nonce, str) or not is_env(env):
            return self.error("set_env needs a string nonce and an env object of strings")
        reply = {"op": "set_env", "nonce": nonce}
        invalid = invalid_entry(env)
        if invalid is not None:          # nothing changes: every later process would fail
            reply["error"] = invalid
        elif not self.supervisor.set_sandbox_env(env):
            reply["error"] = "the Python REPL is not reading its commands; it keeps its environment"
        self.channel.send_control(reply)

    def on_prepare_freeze(self, msg):
        # Waiting for the preloads takes seconds
        self._answer_from_chores(msg, self._prepare_freeze)

    def on_prepare_pause(self, msg):
        # Writing back a large file takes a while
        self._answer_from_chores(msg, self._prepare_pause)

    def _answer_from_chores(self, msg, work):
        """Queues work(nonce) for the chores thread, which sends the answer: the main thread
        must go on reading cancels meanwhile."""
        nonce = msg.get("nonce")
        if not isinstance(nonce, str):
            return self.error("%s needs a string nonce" % msg.get("op"))
        self.chores.put((work, nonce))

    def _run_chores(self):
        # Not a thread per request: one that ended right after its prepare_freeze answer ended
        # in every VM restored from the frozen template, and a thread's first exit runs glibc
        # and kernel code nothing ran before the freeze. Each restored VM then read a page of
        # libc from its disk and translated ~5,000 blocks more under TCG before its hello.
        while True:
            work, nonce = self.chores.get()
            try:
                work(nonce)
            except Exception as e:      # a bug must not end the thread that answers
                log("internal error:\n" + traceback.format_exc())
                self.error("internal error: %s" % e)

    def _prepare_freeze(self, nonce):
        reply = {"op": "prepare_freeze", "nonce": nonce, "zeroed_bytes": 0}
        if not self.supervisor.wait_ready(READY_TIMEOUT):
            reply["error"] = "the Python REPL was not ready within %d s" % READY_TIMEOUT
        # The worker froze its own heap when it became ready; the agent's is small, but a
        # collection in every restored VM would copy its pages all the same.
        gc.collect()
        gc.freeze()
        if self.system:
            try:
                reply["zeroed_bytes"] = guest_system.zero_free_memory()
            except OSError as e:
                reply["error"] = "cannot zero free memory: %s" % e
        self.channel.send_control(reply)

    def _prepare_pause(self, nonce):
        reply = {"op": "prepare_pause", "nonce": nonce, "released_files": 0}
        if self.upper_fd is not None:
            try:
                reply["released_files"] = guest_system.release_written_files(self.upper_fd)
            except OSError as e:
                reply["error"] = "cannot release the cache of written files: %s" % e
        self.channel.send_control(reply)

    def on_cancel_all(self, msg):
        nonce = msg.get("nonce")
        if not isinstance(nonce, str):
            return self.error("cancel_all needs a string nonce")
        self.supervisor.cancel_running("shutdown")
        # Answered through the executor, after the exits of the bash execs it ended
        self.bash.cancel_all(lambda: self.executor.emit({"op": "cancel_all", "nonce": nonce}))

    def shutdown(self):
        """stdin closed (--stdio): kill what we started and exit."""
        self.supervisor.kill()
        self.bash.kill_running()
        os._exit(0)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="hostd guest agent")
    parser.add_argument("--stdio", action="store_true",
                        help="speak the protocol on stdin/stdout instead of the virtio port")
    parser.add_argument("--no-system", action="store_true",
                        help="never set the clock, reseed the kernel RNG, use cgroups or zero "
                             "free memory (tests)")
    parser.add_argument("--repl-fds", metavar="IN,OUT",
                        help="with --stdio: the fds the REPL worker reads and writes (tests)")
    parser.add_argument("--workdir", default="/root", help="cwd and HOME of Python and bash")
    parser.add_argument("--template-file", default=DEFAULT_PATH,
                        help="the template's settings: modules to preload, environment")
    args = parser.parse_args(argv)
    if args.stdio:
        args.repl_fds = tuple(int(fd) for fd in (args.repl_fds or "").split(",") if fd)
        if len(args.repl_fds) != 2:
            parser.error("--stdio needs --repl-fds IN,OUT")
    return args


def open_channels(args):
    """(read fd, write fd) of the agent port and (read fd, write fd) of the REPL port."""
    if args.stdio:
        wfd = os.dup(1)
        os.dup2(2, 1)    # a stray print must not corrupt the protocol stream
        return (0, wfd), args.repl_fds
    fd = open_port(PORT_NAME)
    repl_fd = open_port(REPL_PORT_NAME)
    return (fd, fd), (repl_fd, repl_fd)


def main(argv=None):
    args = parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    system = not args.no_system
    template = load_template(args.template_file, log)
    env = DefaultEnvironment(workdir, template.env)
    # Before the first REPL worker starts (in serve()): HTTP(S) clients go out through hostd.net.
    env.merge(net_relay.PROXY_ENV)
    # A template that sets one of these itself (its own BLAS kernels, its own tunables) keeps it.
    env.merge({k: v for k, v in cpu_quirks.emulation_env().items() if k not in template.env})
    try:
        (rfd, wfd), repl_fds = open_channels(args)
    except OSError as e:
        log("cannot open the virtio ports: %s" % e)
        return 1
    cgroups = Cgroups(system, log)
    if not args.stdio:
        files_server.start(open_port)    # hostd.files, in its own thread: never behind an exec
        net_relay.start(open_port)       # hostd.net: the guest's only way out
        proc_server.start(open_port, env, cgroups)   # hostd.proc: processes outside the queue
    for fd in repl_fds:
        os.set_inheritable(fd, False)    # only the worker gets them (pass_fds)
    channel = Channel(wfd, log)
    executor = Executor(channel, log)
    bash = BashRunner(executor, cgroups, env, workdir)
    supervisor = Supervisor(executor, env, repl_fds, cgroups, workdir, template.preload, log)
    Agent(channel, executor, bash, supervisor, system).serve(rfd, stdio=args.stdio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
