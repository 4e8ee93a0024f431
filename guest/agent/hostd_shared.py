"""What the guest agent (agent.py) and the REPL worker (repl_worker.py) both need: the
protocol's message encoding, the cutting of output into `out` messages, and the layout of the
memory page the two share.

The worker answers Python execs on its own port, so the agent is not on their path; the
shared page is how the agent still knows what the worker is doing (for cancels, and to finish
the exec of a worker that died) without a message, hence without waking either process.
"""

import fcntl
import json
import mmap
import os
import select
import struct
import time

MAX_PIECE = 65536           # at most this many bytes of output per `out` message
MAX_INPUT_LINE = 4 << 20    # the host never sends more than 1 MiB per line; beyond is garbage
MAX_DISPLAY_LINE = 16 << 20  # a `display` line (a base64 image) may be this long, newline included
DRAIN_LIMIT = 1 << 20       # bytes read from a pipe beyond what it held (orphans may write forever)
F_GETPIPE_SZ = 1032         # Linux: a pipe's capacity (user code may have grown it)
TIMED_OUT = "hostd: execution timed out"


def cwd_error(path, error):
    """The stderr line of an exec whose `cwd` cannot be used (it then exits 1 without running)."""
    return "hostd: cwd %s: %s" % (path, error.strerror or error)


def cancel_exit_code(reason):
    """The exit code of an exec cancelled for `reason` (guest/PROTOCOL.md, cancel)."""
    return 124 if reason == "timeout" else 130


def drain_budget(fd):
    """How much to read from a pipe when its writer is done: all it holds (user code may have
    grown it), plus at most DRAIN_LIMIT more (orphans may write forever)."""
    try:
        return fcntl.fcntl(fd, F_GETPIPE_SZ) + DRAIN_LIMIT
    except OSError:
        return DRAIN_LIMIT


def read_lines(fd, on_line, log, stop_at_eof=False, on_oversized=None, before_read=None):
    """Reads newline-delimited messages from a host port and calls on_line(bytes) for each.

    At EOF the host end of a virtio port is closed: reads return EOF at once until it
    reconnects, and a reconnection starts with a fresh hello, so the partial line is dropped
    and reading goes on. With stop_at_eof (pipes, in tests) EOF or a read error returns. A
    line over MAX_INPUT_LINE is dropped up to its newline, after on_oversized() if given.
    before_read(), if given, is called whenever every line read so far has been handled, right
    before the read that waits for more (the REPL runs its asyncio tasks there).
    """
    buf = bytearray()
    skipping = False                 # inside an oversized line: drop up to its newline
    while True:
        if before_read is not None:
            before_read()
        try:
            data = os.read(fd, 65536)
        except OSError as e:
            if stop_at_eof:
                return
            log("port read failed: %s" % e)
            time.sleep(0.1)
            continue
        if not data:
            if stop_at_eof:
                return
            del buf[:]
            time.sleep(0.05)
            continue
        start = len(buf)
        buf += data
        pos = 0
        nl = buf.find(b"\n", start)
        while nl >= 0:
            if not skipping:
                on_line(bytes(buf[pos:nl]))
            skipping = False
            pos = nl + 1
            nl = buf.find(b"\n", pos)
        del buf[:pos]
        if len(buf) > MAX_INPUT_LINE:
            if not skipping and on_oversized is not None:
                on_oversized()
            skipping = True
            del buf[:]


def encode(msg):
    # backslashreplace turns a lone surrogate (e.g. echoed from a nonce) into a valid JSON escape
    text = json.dumps(msg, ensure_ascii=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "backslashreplace")


def wait_writable(fd):
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    poller.poll()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:          # an fd inherited in non-blocking mode
            wait_writable(fd)


def utf8_cut(buf, start, end):
    """Where to cut buf near `end` (> start) so that no UTF-8 character is split."""
    for cut in range(end, max(start, end - 4), -1):
        if buf[cut] & 0xC0 != 0x80:     # not a continuation byte: a character starts here
            return cut
    return end                          # not UTF-8 anyway; any cut is as good


def salvage_hello(line):
    """Find a hello glued behind garbage: a restored VM may hold half a line from the moment
    it was frozen, followed by the host's hello. Returns the hello or None."""
    text = line.decode("utf-8", "replace")
    if '"hello"' not in text:
        return None
    decoder = json.JSONDecoder()
    floor = max(0, len(text) - 4096)    # a hello is small; bounds the work on a huge line
    i = text.rfind("{", floor)
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
            if isinstance(obj, dict) and obj.get("op") == "hello" and not text[end:].strip():
                return obj
        except ValueError:
            pass
        i = text.rfind("{", floor, i)
    return None


def parse_line(line):
    """A host message as a dict, or None for a line that is not one (noise before hello)."""
    try:
        msg = json.loads(line)
    except ValueError:
        msg = salvage_hello(line)
    return msg if isinstance(msg, dict) else None


class LineCutter:
    """One output stream (stdout or stderr) of one exec, cut into `out` messages: one per line,
    long lines in pieces of at most MAX_PIECE bytes. Messages are appended to `outbox`. Armed
    with `mark_partial` (notebook execs), a piece that does not end its line (a piece of a long
    line, a last line without its newline) says so: `"partial":true`."""

    def __init__(self, name, outbox):
        self.name, self.outbox = name, outbox
        self.buf = bytearray()          # the current, incomplete line
        self.prefix = b""
        self.mark_partial = False

    def arm(self, exec_id, mark_partial=False):
        """Attribute what is fed from now on to exec `exec_id`."""
        self.prefix = ('{"op":"out","id":%d,"stream":"%s","data":' % (exec_id, self.name)).encode()
        self.mark_partial = mark_partial
        del self.buf[:]

    def feed(self, data):
        self.buf += data
        self._cut(final=False)

    def finish(self):
        """The exec is over: send the last partial line."""
        self._cut(final=True)

    def _cut(self, final):
        buf, msgs = self.buf, self.outbox
        pos = 0
        nl = buf.find(b"\n")
        while nl >= 0:
            self._line(buf, pos, nl, True)
            pos = nl + 1
            nl = buf.find(b"\n", pos)
        if final:
            if pos < len(buf):
                self._line(buf, pos, len(buf), False)
            pos = len(buf)
        else:
            # A line longer than MAX_PIECE is sent as it arrives (never buffered whole). What
            # is held back is never empty after a piece went out, so no spurious empty line
            # can follow.
            while len(buf) - pos > MAX_PIECE:
                cut = utf8_cut(buf, pos, pos + MAX_PIECE)
                msgs.append(self._msg(buf[pos:cut], False))
                pos = cut
        del buf[:pos]

    def _line(self, buf, start, end, complete):
        while end - start > MAX_PIECE:
            cut = utf8_cut(buf, start, start + MAX_PIECE)
            self.outbox.append(self._msg(buf[start:cut], False))
            start = cut
        self.outbox.append(self._msg(buf[start:end], complete))

    def _msg(self, piece, complete):
        data = json.dumps(piece.decode("utf-8", "replace"), ensure_ascii=False)
        end = b"}\n" if complete or not self.mark_partial else b',"partial":true}\n'
        return self.prefix + data.encode("utf-8") + end


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
