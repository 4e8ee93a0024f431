"""Cancels in the REPL worker, and the agent's other commands to it.

The agent cancels a Python exec with a message on the worker's command pipe, a count in the
shared page, then a SIGINT. The SIGINT handler here turns it into a KeyboardInterrupt in the
cell, but only for the exec the cancel names: a SIGINT that raced with the end of its exec is
ignored, and one that comes with no cancel at all was sent by user code (os.kill,
signal.raise_signal) and interrupts as in any Python program.

An exec is named by (epoch, id): the epoch of the host connection that sent it (the REPL hello
it came after) and its id, since ids start again at 1 with each connection and a fork child
inherits its parent's unread cancels.

Agent -> worker messages on the command pipe (one JSON object per line):
  {"op":"cancel","id":N,"epoch":E,"reason":R}  cancel exec (E, N)
  {"op":"env","set":{...},"unset":[...]}       the sandbox's default environment changed;
                                               applied to os.environ before the next cell
"""

import json
import os
import threading


class State:
    """What the signal handler, the output streams and the cell runner share. Plain attributes
    of one object: the handler runs between two bytecodes of whatever the main thread does."""

    def __init__(self):
        self.running = False        # user code runs: only then does a SIGINT interrupt
        self.in_io = False          # inside Output under its lock: an interrupt waits
        self.deferred = False       # an interrupt came while in_io
        self.forked = False         # this is a child of os.fork() of the worker
        self.current = None         # (epoch, id) of the exec being run
        self.cancels = {}           # (epoch, id) -> reason, as the agent sent them
        self.env_changes = {}       # name -> value, or None to unset: for the next cell
        self.main_ident = threading.get_ident()


state = State()
commands = None                     # the Commands of this worker, once main() made it


class Commands:
    """The agent's command pipe, read only when the shared page's count says it holds news,
    so that an exec pays no syscall for it."""

    def __init__(self, fd, shared):
        self.fd, self.shared = fd, shared
        os.set_blocking(fd, False)
        self.buf = bytearray()
        self.seen = 0               # the agent made the page for this worker

    def read(self, force=False):
        """Takes in the agent's new messages; True if there was a cancel among them."""
        count = self.shared.commands
        if count == self.seen and not force:
            return False
        self.seen = count
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            self.buf += data
        got = False
        nl = self.buf.find(b"\n")
        while nl >= 0:
            line = bytes(self.buf[:nl])
            del self.buf[:nl + 1]
            got = self._take(line) or got
            nl = self.buf.find(b"\n")
        return got

    @staticmethod
    def _take(line):
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "cancel":
                state.cancels[(int(msg["epoch"]), int(msg["id"]))] = msg.get("reason", "client")
                return True
            if op == "env":
                for name in msg.get("unset", ()):
                    state.env_changes[name] = None
                state.env_changes.update(msg.get("set", {}))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return False


def forget_cancels_before(key):
    """Drops the cancels of execs that came before exec `key`: they can no longer matter."""
    for old in [k for k in state.cancels if k < key]:
        del state.cancels[old]


def on_sigint(signum, frame):
    """The worker's SIGINT handler (see the module's doc)."""
    if not state.running:
        return
    got = commands.read(force=True)
    if state.current in state.cancels or not got:
        if state.in_io:
            state.deferred = True
        else:
            raise KeyboardInterrupt


def raise_deferred_interrupt():
    """Raises the interrupt that came while the main thread held the output lock."""
    if state.deferred and state.running:
        state.deferred = False
        raise KeyboardInterrupt
