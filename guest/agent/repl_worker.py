"""hostd Python REPL worker (guest/PROTOCOL.md, "Python semantics").

The worker answers Python execs itself, on its own virtio-serial port (`hostd.repl`): it reads
each exec from the port, runs it in its main thread and writes the output and the exit back.
Under TCG every switch between two guest processes flushes QEMU's soft TLB and jump cache, so an
exec that went host -> agent -> worker -> agent -> host cost more than one that stays in this
process (docs/architecture.md, "Measured choices in the code"). The agent still supervises it, without being on that path: it starts it, forwards
cancels (a message on its command pipe plus a SIGINT, repl_interrupts.py), kills it when it
ignores one, and finishes the exec of a worker that died, from what the worker left in the
shared page (hostd_shared_page.py).

The agent starts it as `python3 -u repl_worker.py CONFIG`, CONFIG a JSON object:
  port_in, port_out  the hostd.repl port
  commands           the agent's command pipe (repl_interrupts.py)
  shared             the memfd of the page shared with the agent
  out_r, err_r       the read ends of the pipes on its fds 1 and 2: output of C extensions and
                     of subprocesses, read by this process's io thread
  log                where its own messages go (the agent's stderr: the VM console)
  notice             exit status of the worker this one replaces (the first exec says so on
                     stderr), or null
  preload            modules to import before it says it is ready (the template's)

Its modules are named repl_* and hostd_*: they are in sys.modules, where user code can see
them, so their names must not take a name user code would use.
"""

import builtins
import gc
import importlib
import json
import os
import signal
import sys
import threading
import traceback
import types

import repl_interrupts
import repl_magics  # noqa: F401 -- notebook cells call it by name (repl_notebook.py)
from hostd_exec_end import TIMED_OUT, cancel_exit_code
from hostd_shared_page import SharedPage
from hostd_wire import encode, parse_line, read_lines
from repl_cells import CellRunner
from repl_contexts import ContextError, Contexts
from repl_display import Display
from repl_interrupts import Commands, forget_cancels_before, on_sigint, state
from repl_loop import EventLoop
from repl_output import Notices, Output, guarded, install_streams
from repl_scope import ExecScope, apply_env_changes, valid_env

INTERRUPTED = 130           # KeyboardInterrupt that no cancel explains (user code raised it)
NO_STDIN = "input() is not available: a sandbox exec has no stdin"


class Worker:
    """The REPL: one namespace, and the execs of its port, one at a time, in its main thread
    (user code expects signals and the GIL's main thread there)."""

    def __init__(self, port_in, output, shared, notice, log):
        self.port_in, self.output, self.shared, self.log = port_in, output, shared, log
        self.notice = notice             # exit status of the worker this one replaces
        self.reseed = False
        self.copies_seen = shared.copies  # a new process: its generators are its own
        self.hello_epoch = shared.hello_epoch
        self.main_module = types.ModuleType("__main__")
        self.main_module.__builtins__ = builtins
        self.notices = Notices(output)
        self.loop = EventLoop(shared, log)
        self.display = Display(output)
        self.cells = CellRunner(self.display, self.loop, self.notices)
        self.contexts = Contexts(self.main_module, builtins, self._set_main_module)

    def _set_main_module(self, module):
        """The default context restarted: its fresh namespace is __main__ from now on."""
        self.main_module = module
        sys.modules["__main__"] = module

    def serve(self):
        read_lines(self.port_in, self.handle, self.log, before_read=self._before_read)

    def _before_read(self):
        if self.loop.loop is not None and self.loop.has_tasks():
            self.loop.run_until_readable(self.port_in)

    def handle(self, line):
        try:
            self._handle(line)
        except Exception:                # a bug must not take the REPL down
            self.log("internal error:\n" + traceback.format_exc())

    def _handle(self, line):
        msg = parse_line(line) if line.strip() else None
        if msg is None:
            return
        op = msg.get("op")
        if op == "exec":
            exec_id, code, env = msg.get("id"), msg.get("code"), msg.get("env")
            cwd, display = msg.get("cwd"), msg.get("display", False)
            context, notebook = msg.get("context"), msg.get("notebook", False)
            if (isinstance(exec_id, int) and exec_id > 0 and isinstance(code, str)
                    and valid_env(env) and (cwd is None or isinstance(cwd, str))
                    and isinstance(display, bool) and isinstance(notebook, bool)
                    and (context is None or isinstance(context, str))):
                return self.run(exec_id, lambda key: self._cell(
                    key, code, env, cwd, display, context, notebook), notebook)
            return self.reply({"op": "error", "message": "exec needs an id > 0 and a code; "
                               "env, cwd, display, context and notebook are optional: object, "
                               "string, bool, string, bool"})
        if op == "context":
            exec_id = msg.get("id")
            if isinstance(exec_id, int) and exec_id > 0:
                return self.run(exec_id, lambda key: self._context_request(exec_id, msg))
            return self.reply({"op": "error", "message": "context needs an id > 0"})
        if op == "hello":
            return self.hello(msg)
        self.reply({"op": "error", "message": "unknown op %r on the REPL port" % (op,)})

    def hello(self, msg):
        # A new host connection, whose exec ids start again. If the agent was told the VM is
        # a new copy since the last one, its generators are its siblings' too (counted, not
        # flagged: a copy whose first exec came only after a hostd restart still gets them)
        copies = self.shared.copies
        if copies != self.copies_seen:
            self.copies_seen = copies
            self.reseed = True
        self.shared.taken = self.shared.done = 0
        self.hello_epoch = self.shared.hello_epoch = self.shared.epoch
        self.reply({"op": "hello", "nonce": msg.get("nonce"), "pid": os.getpid()})

    def reply(self, msg):
        with self.output.lock:
            self.output.message(msg)

    def run(self, exec_id, execute, notebook=False):
        """One exec (or context request), from taking it to its exit. The shared page says
        which exec the worker holds (taken) and which it has finished (done), for the agent's
        cancels and for when the worker dies; execute(key) does the work and returns its exit
        code, or (code, rejected) for an exec it did not run."""
        out, shared = self.output, self.shared
        key = (self.hello_epoch, exec_id)
        state.current = key
        shared.taken = exec_id
        with out.lock:
            out.arm(exec_id, mark_partial=notebook)
        repl_interrupts.commands.read()
        forget_cancels_before(key)
        if state.env_changes:
            apply_env_changes(state.env_changes)
            state.env_changes.clear()
        rejected = None
        if self.hello_epoch != shared.epoch:
            # Sent before the agent's latest hello (by a hostd that has since gone): its
            # client is gone too, and what the new one sends must not wait behind it.
            status = cancel_exit_code("shutdown")
        else:
            status = execute(key)
            if isinstance(status, tuple):
                status, rejected = status
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()           # user code may have replaced them with buffered ones
            except Exception:
                pass
        repl_interrupts.commands.read()
        reason = state.cancels.get(key)
        if reason is not None:
            status = cancel_exit_code(reason)
            if reason == "timeout":
                self.notices.write(TIMED_OUT + "\n")
        state.deferred = False
        for _ in range(3):               # the exit must go out, even if a signal handler of
            try:                         # user code (an alarm) raises in the middle
                with out.lock:
                    out.end(exec_id, status, rejected)
                break
            except BaseException:
                pass
        state.current = None

    def _cell(self, key, code, env, cwd, display, context_id, notebook):
        """An exec: in its context (rejected when there is no such context), announced with a
        `start` message when it names a context or is a notebook cell."""
        context = self.contexts.get(context_id)
        if context is None:
            return 1, "context_not_found"
        if notebook:
            context.count += 1
        if notebook or context_id is not None:
            start = {"op": "start", "id": key[1]}
            if notebook:
                start["execution_count"] = context.count
            with self.output.lock:
                self.output.insert(encode(start))
        return self._execute(key, code, env, cwd, display or notebook, context, notebook)

    def _context_request(self, exec_id, msg):
        """A request about the contexts (create, list, delete, restart), answered with one
        `context` message before its exit (guest/PROTOCOL.md)."""
        action, context_id, cwd = msg.get("action"), msg.get("context"), msg.get("cwd")
        answer = {"op": "context", "id": exec_id}
        try:
            if context_id is not None and not isinstance(context_id, str):
                raise ContextError("bad_request", "context must be a string")
            if cwd is not None and not isinstance(cwd, str):
                raise ContextError("bad_request", "cwd must be a string")
            if action == "list":
                answer["contexts"] = self.contexts.list()
            elif action == "create":
                answer["context"] = self.contexts.create(context_id, cwd)
            elif action == "restart":
                answer["context"] = self.contexts.restart(context_id)
            elif action == "delete":
                self.contexts.delete(context_id)
            else:
                raise ContextError("bad_request", "unknown context action %r" % (action,))
        except ContextError as e:
            answer["error"], answer["message"] = e.code, str(e)
        with self.output.lock:
            self.output.insert(encode(answer))
        return 0

    def _execute(self, key, code, env, cwd, display, context, notebook):
        """Runs the cell of exec `key` in its context and scope; returns its exit code."""
        if key in state.cancels:
            # Cancelled before it ran (its client may be gone: hostd ends a cancelled exec
            # when the worker that held it dies): the notice is for the next exec that runs.
            return INTERRUPTED
        if self.notice is not None:
            self.notices.write("hostd: the Python REPL exited (code %d); started a fresh one, "
                               "previous state is lost\n" % self.notice)
            self.notice = None
        if self.reseed:
            self.reseed = False
            reseed_generators(self.log)
        entered = self.contexts.enter(context)
        if isinstance(entered, str):
            self.notices.write(entered + "\n")
            return 1
        try:
            scope = ExecScope(env, cwd) if env or cwd is not None else None
            if scope is not None:
                error = scope.enter()
                if error is not None:
                    self.notices.write(error + "\n")
                    return 1
            self.display.enabled, self.display.notebook = display, notebook
            status = INTERRUPTED
            try:
                try:
                    state.running = True
                    if self.shared.commands != repl_interrupts.commands.seen:
                        state.running = False        # one came since the read in run(): its
                        repl_interrupts.commands.read()  # SIGINT may have found running False
                        state.running = True
                    if key not in state.cancels:     # a cancel may come before the exec
                        status = self.cells.run(code, "<exec-%d>" % key[1],
                                                context.module.__dict__, notebook)
                finally:
                    state.running = False
            except KeyboardInterrupt:        # a cancel, or raised by user code
                pass
            finally:
                self.display.enabled = self.display.notebook = False
                if scope is not None:
                    scope.exit()
            return status
        finally:
            self.contexts.leave(context, entered)


def reseed_generators(log):
    """Fresh seeds, from os.urandom (which the agent has reseeded), for the generators that code
    draws from without seeding: Python's `random` and, once imported, numpy's global one
    (np.random.rand, and pandas' and scikit-learn's default). Without it every copy of a
    frozen VM draws what its siblings draw. The numpy state is set whole (MT19937's 624 words)
    rather than by np.random.seed(), whose first call costs several times more under TCG
    (docs/architecture.md, "Measured choices in the code")."""
    import random
    random.seed()
    mtrand = sys.modules.get("numpy.random.mtrand")
    if mtrand is None:
        return
    try:
        key = sys.modules["numpy"].frombuffer(os.urandom(624 * 4), dtype="<u4")
        mtrand.set_state(("MT19937", key, 624))
    except Exception as e:               # a numpy without it: its generator stays shared
        log("cannot reseed numpy's global generator: %r" % (e,))


def preload(modules, log):
    """Imports the template's modules, so that importing them in a cell costs nothing. They are
    in sys.modules, not in the cell namespace. One that fails is logged and skipped."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:       # SystemExit too: a module must not end the worker
            log("cannot preload %s: %s" % (name, "".join(
                traceback.format_exception_only(type(e), e)).strip()))


def install_builtins(output, display):
    def input(prompt=""):
        """There is no stdin to read: says so, after the prompt (on a line of its own)."""
        if prompt:
            sys.stdout.write(str(prompt))
            sys.stdout.flush()
        with guarded(output) as out:
            out.end_lines()
        raise EOFError(NO_STDIN)
    builtins.input = input
    builtins.display = display.display


def main():
    config = json.loads(sys.argv[1])
    port_in, port_out = config["port_in"], config["port_out"]
    log_fd = config.get("log")
    own = {port_in, port_out, config["commands"], config["shared"], config["out_r"],
           config["err_r"]} | ({log_fd} if log_fd is not None else set())
    for fd in own:
        os.set_inheritable(fd, False)   # subprocesses of user code must not get them

    def log(text):
        try:
            os.write(log_fd if log_fd is not None else 2, ("hostd-repl: %s\n" % text).encode())
        except OSError:
            pass

    shared = SharedPage(config["shared"])
    output = Output(port_out, shared, {"stdout": config["out_r"], "stderr": config["err_r"]}, log)
    own |= {output.wake_r, output.wake_w}
    if output.timer is not None:
        own.add(output.timer.fd)

    def in_child():
        # Nor forked children (multiprocessing): one holding the port would steal the host's
        # messages, and one writing the shared outbox would corrupt this worker's output.
        state.forked = True
        state.running = False
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in own:
            try:
                os.close(fd)
            except OSError:
                pass
    os.register_at_fork(after_in_child=in_child)
    repl_interrupts.commands = Commands(config["commands"], shared)
    worker = Worker(port_in, output, shared, config.get("notice"), log)
    # User code runs in a fresh __main__ (a notebook-like namespace); this module stays
    # importable under another name so that its globals stay alive.
    sys.modules["_hostd_repl_worker"] = sys.modules["__main__"]
    sys.modules["__main__"] = worker.main_module
    sys.argv = [""]
    install_streams(output)
    threading.Thread(target=output.io_thread, name="hostd-io", daemon=True).start()
    preload(config.get("preload") or (), log)
    sys.path[0] = ""                    # like the interactive interpreter: import from cwd
    install_builtins(output, worker.display)
    worker.display.figures.install()
    # Everything loaded so far lives as long as the worker: out of the collector's sight, a
    # collection in a restored VM does not write to (and so copy) the pages that hold it.
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGINT, on_sigint)
    shared.ready = 1
    worker.serve()


if __name__ == "__main__":
    main()
