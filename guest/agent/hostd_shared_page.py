"""The memory page the agent and the REPL worker share.

The worker answers Python execs on its own port, so the agent is not on their path; the
shared page is how the agent still knows what the worker is doing (for cancels, and to finish
the exec of a worker that died) without a message, hence without waking either process.
"""

import mmap
import os
import struct


def _field(index):
    offset = 8 * index
    return property(lambda self: _Q.unpack_from(self.map, offset)[0],
                    lambda self, value: _Q.pack_into(self.map, offset, value))


_Q = struct.Struct("<q")


class SharedPage:
    """A memfd both processes map. Each field has one writer. All start at 0.

    epoch        (agent) bumped on each hello on its port: a new host connection, whose exec
                 ids start again at 1
    commands     (agent) count of messages written to the worker's command pipe: the worker
                 reads the pipe only when this moved, so an exec costs no syscall for it
    ready        (worker) 1 once it has preloaded its modules and handles SIGINT: before, a
                 SIGINT would kill it
    taken        (worker) id of the last exec it took from its port (0 after a REPL hello)
    done         (worker) id of the last exec whose exit is in the outbox or written (0 after
                 a REPL hello)
    outlen       (worker) bytes of encoded messages in the outbox, not yet written to the port
    hello_epoch  (worker; seeded by the agent for a fresh worker) the epoch of the last REPL
                 hello it read: its taken/done ids belong to that connection, and an exec it
                 reads while this differs from epoch was sent before the latest hello
    idle_loop    (worker) 1 while it runs asyncio tasks between cells, waiting for its port
    copies       (agent) bumped on each hello that says the VM is a new copy of a frozen
                 state (a new sandbox, a fork child): at its next REPL hello the worker gives
                 the random generators it shares with its siblings fresh seeds
    outbox       (worker) the unwritten messages: they survive the worker, so output printed
                 just before a crash (os._exit, a segfault, the OOM killer) still reaches the
                 host. A message longer than the outbox goes through it in pieces, so the
                 outbox may end inside a message (see take_outbox).
    """

    HEAD_SIZE = 128
    OUTBOX_SIZE = 1 << 20

    epoch = _field(0)
    commands = _field(1)
    ready = _field(2)
    taken = _field(3)
    done = _field(4)
    outlen = _field(5)
    hello_epoch = _field(6)
    idle_loop = _field(7)
    copies = _field(8)

    def __init__(self, fd=None):
        if fd is None:
            fd = os.memfd_create("hostd-repl", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.HEAD_SIZE + self.OUTBOX_SIZE)
        self.fd = fd
        self.map = mmap.mmap(fd, self.HEAD_SIZE + self.OUTBOX_SIZE)
        self.view = memoryview(self.map)
        self.outbox = self.view[self.HEAD_SIZE:]

    def take_outbox(self):
        """What the worker left unwritten (it is dead), emptying the outbox, and ended by a
        newline: the worker may have died half-way through a message (while writing it, or
        between two pieces of a long one); that newline ends the torn line, which the host
        drops, instead of gluing it to what the agent writes next. After whole messages it
        only adds an empty line, which the host ignores as well."""
        n = min(max(self.outlen, 0), self.OUTBOX_SIZE)
        data = bytes(self.outbox[:n]) + b"\n"
        self.outlen = 0
        return data
