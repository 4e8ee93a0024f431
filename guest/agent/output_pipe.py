"""An output pipe of a process the agent ran (bash, or a REPL worker that died), cut into `out`
messages."""

import os

from hostd_output_cut import LineCutter, drain_budget


class OutputPipe:
    """One output pipe (stdout or stderr), cut into `out` messages (hostd_output_cut.LineCutter)
    appended to `outbox`, which the executor writes to the channel after each round."""

    def __init__(self, fd, name, outbox):
        os.set_blocking(fd, False)
        self.fd = fd
        self.cutter = LineCutter(name, outbox)
        self.done = True                # True: no exec listens, output is discarded
        self.eof = False

    def arm(self, exec_id):
        """Attribute what is read from now on to exec `exec_id`."""
        self.cutter.arm(exec_id)
        self.done = self.eof

    def pump(self):
        """Read what is there (one read); False at EOF."""
        try:
            data = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return True
        if not data:
            self.eof = True
            self.finish()
            return False
        if not self.done:
            self.cutter.feed(data)
        return True

    def drain(self):
        """Read what is there without blocking: what a dead writer left (drain_budget)."""
        budget = drain_budget(self.fd)
        while budget > 0 and not self.eof:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                self.eof = True
                return
            budget -= len(data)
            if not self.done:
                self.cutter.feed(data)

    def finish(self):
        """The exec is over for this stream: send the last partial line, stop listening."""
        if not self.done:
            self.cutter.finish()
            self.done = True
