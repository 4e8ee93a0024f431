"""A single-threaded event loop for one thread of the agent: fd callbacks, timers, and jobs that
other threads post. Everything the loop's callbacks touch belongs to its thread, so they need
no locks; other threads reach it only through post()."""

import collections
import heapq
import itertools
import os
import selectors
import time
import traceback


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when, callback):
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self):
        self.cancelled = True


class Loop:
    def __init__(self, log):
        self.log = log
        self.sel = selectors.DefaultSelector()
        self._masks = {}                 # fd -> (mask, {EVENT_READ: cb, EVENT_WRITE: cb})
        self._timers = []                # heap of (when, seq, Timer)
        self._seq = itertools.count()
        self._jobs = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.stopped = False

    # ---- from any thread ------------------------------------------------------------------

    def post(self, job):
        """Runs job() on the loop's thread, before it reads any fd again."""
        self._jobs.append(job)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass                         # the pipe is full: a wake-up is pending anyway

    # ---- from the loop's thread -----------------------------------------------------------

    def want(self, fd, event, callback):
        """Calls callback() whenever fd is ready for `event` (EVENT_READ or EVENT_WRITE), until
        unwant(fd, event). Calling it again replaces the callback."""
        mask, callbacks = self._masks.get(fd, (0, {}))
        callbacks = dict(callbacks)
        callbacks[event] = callback
        self._set(fd, mask | event, callbacks)

    def unwant(self, fd, event):
        if fd not in self._masks:
            return
        mask, callbacks = self._masks[fd]
        callbacks = {e: cb for e, cb in callbacks.items() if e != event}
        self._set(fd, mask & ~event, callbacks)

    def forget(self, fd):
        """Stops watching fd for anything (call before closing it)."""
        if self._masks.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def _set(self, fd, mask, callbacks):
        old = self._masks.get(fd, (0, {}))[0]
        if mask == 0:
            self._masks.pop(fd, None)
            if old:
                self.sel.unregister(fd)
            return
        self._masks[fd] = (mask, callbacks)
        if old == 0:
            self.sel.register(fd, mask, fd)
        elif old != mask:
            self.sel.modify(fd, mask, fd)

    def call_at(self, when, callback):
        """Calls callback() at monotonic time `when`; returns a Timer that can be cancelled."""
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def call_later(self, seconds, callback):
        return self.call_at(time.monotonic() + seconds, callback)

    def run(self):
        while not self.stopped:
            try:
                self.step()
            except Exception:
                self.log("internal error:\n" + traceback.format_exc())
                time.sleep(0.01)         # a persistent bug must not spin a CPU

    def step(self, max_wait=None):
        """One round: posted jobs, then ready fds, then due timers."""
        self._run_jobs()
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        timeout = max_wait
        if self._timers:
            due = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = due if timeout is None else min(timeout, due)
        if self._jobs:
            timeout = 0
        ready = self.sel.select(timeout)
        # Jobs first: another thread's news (a new host connection) must be acted on before
        # anything that arrived after it is read.
        self._run_jobs()
        for key, events in ready:
            if key.fd == self._wake_r:
                continue
            for event in (selectors.EVENT_WRITE, selectors.EVENT_READ):
                if not events & event:
                    continue
                # An earlier callback of this round may have dropped or replaced this fd
                entry = self._masks.get(key.fd)
                callback = entry[1].get(event) if entry else None
                if callback is not None:
                    callback()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            timer = heapq.heappop(self._timers)[2]
            if not timer.cancelled:
                timer.callback()

    def _run_jobs(self):
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._jobs:
            self._jobs.popleft()()
