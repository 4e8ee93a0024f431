"""The agent's executor thread: one selector loop that turns bash output into `out` messages,
notices processes ending (bash, the REPL worker), runs timers, and jobs other threads post.

It writes the channel synchronously, once per loop round: when the host stops reading, the
executor blocks, stops reading the pipes, and the producers block on full pipes. Memory stays
bounded with no queue at all. Everything but post() is for the executor thread itself.
"""

import collections
import heapq
import itertools
import os
import selectors
import threading
import time
import traceback

from hostd_wire import encode


class Timer:
    def __init__(self, when, callback):
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self):
        self.cancelled = True


class Executor:
    def __init__(self, channel, log):
        self.channel, self.log = channel, log
        self.sel = selectors.DefaultSelector()
        self.outbox = []                 # encoded messages of the current loop round
        self._timers = []                # heap of (when, seq, Timer)
        self._seq = itertools.count()
        self._jobs = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, self._on_wake)

    def start(self):
        threading.Thread(target=self._run, name="executor", daemon=True).start()

    def post(self, job):
        """Runs job() on the executor thread, soon. From any thread."""
        self._jobs.append(job)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass                         # the pipe is full: a wake-up is pending anyway

    def watch(self, fd, callback):
        """Calls callback() whenever fd is readable, until unwatch(fd)."""
        self.sel.register(fd, selectors.EVENT_READ, callback)

    def unwatch(self, fd):
        self.sel.unregister(fd)

    def call_at(self, when, callback):
        """Calls callback() at monotonic time `when`; returns a Timer that can be cancelled."""
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def emit(self, msg):
        """Queues a message for this round's write, after what the round produced so far."""
        self.outbox.append(encode(msg))

    def _run(self):
        while True:
            try:
                self._step()
            except Exception:
                self.log("internal error:\n" + traceback.format_exc())
                time.sleep(0.01)         # a persistent bug must not spin a CPU

    def _step(self):
        while self._jobs:
            self._jobs.popleft()()
        self._flush()                    # before select may block
        timeout = None
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        for key, _ in self.sel.select(timeout):
            # An earlier callback of this batch may have closed this fd (a dead worker)
            if self.sel.get_map().get(key.fd) is key:
                key.data()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            timer = heapq.heappop(self._timers)[2]
            if not timer.cancelled:
                timer.callback()
        self._flush()

    def _flush(self):
        """Writes what this round produced, in one write (this is where backpressure blocks)."""
        if self.outbox:
            self.channel.write(self.outbox)
            del self.outbox[:]

    def _on_wake(self):
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
