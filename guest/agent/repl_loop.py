"""The REPL's one persistent asyncio event loop, for cells that use top-level `await`.

A cell compiled with PyCF_ALLOW_TOP_LEVEL_AWAIT that awaits is a coroutine; it runs on this
loop, which is never closed, so the tasks it creates live on after it. They also run between
cells, as in a notebook: while such tasks exist, the worker waits for its port inside the loop
instead of in a plain read. Until a cell awaits, nothing here costs anything: asyncio is not
even imported.
"""

CO_COROUTINE = 0x0080       # inspect.CO_COROUTINE, without importing inspect


class EventLoop:
    def __init__(self, shared, log):
        self.shared, self.log = shared, log
        self.loop = None

    def run(self, coro):
        """Runs a cell's coroutine to its end and returns its value. Interrupted (a cancel),
        the cell's task is cancelled too, lest it go on running in later cells; the tasks it
        started live on."""
        loop = self._get()
        task = loop.create_task(coro)
        try:
            return loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except BaseException:
                    pass
            elif not task.cancelled():
                task.exception()         # retrieved: asyncio must not log it later
            raise

    def has_tasks(self):
        if self.loop is None:
            return False
        import asyncio
        return bool(asyncio.all_tasks(self.loop))

    def run_until_readable(self, fd):
        """Runs the loop's tasks until fd can be read (an exec came). Output they print goes
        nowhere, as any output while no exec runs."""
        loop = self.loop
        ready = loop.create_future()

        def on_readable():
            loop.remove_reader(fd)
            if not ready.done():
                ready.set_result(None)
        loop.add_reader(fd, on_readable)
        self.shared.idle_loop = 1
        try:
            loop.run_until_complete(ready)
        except BaseException as e:       # a task raised SystemExit, KeyboardInterrupt...
            self.log("an asyncio task stopped the loop between cells: %r" % (e,))
        finally:
            self.shared.idle_loop = 0
            loop.remove_reader(fd)

    def _get(self):
        if self.loop is None:
            import asyncio
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop
