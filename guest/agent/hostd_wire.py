"""The protocol's lines (guest/PROTOCOL.md): each message is one line of JSON, read from and
written to a host port by the agent and by the REPL worker alike. How a message is encoded,
how a line read is parsed (with the hello a restored VM may find glued behind garbage), and the
longest lines either side accepts.
"""

import json
import os
import select
import time

MAX_INPUT_LINE = 4 << 20    # the host never sends more than 1 MiB per line; beyond is garbage
MAX_DISPLAY_LINE = 16 << 20  # a `display` line (a base64 image) may be this long, newline included


def read_lines(fd, on_line, log, stop_at_eof=False, on_oversized=None, before_read=None,
               wait_in_poll=False):
    """Reads newline-delimited messages from a host port and calls on_line(bytes) for each.

    At EOF the host end of a virtio port is closed: reads return EOF at once until it
    reconnects, and a reconnection starts with a fresh hello, so the partial line is dropped
    and reading goes on. With stop_at_eof (pipes, in tests) EOF or a read error returns. A
    line over MAX_INPUT_LINE is dropped up to its newline, after on_oversized() if given.
    before_read(), if given, is called whenever every line read so far has been handled, right
    before the read that waits for more (the REPL runs its asyncio tasks there).

    wait_in_poll: wait for data in poll(), then read (the agent's port). The guest's
    virtio_console wakes a port's readers from the interrupt of any virtqueue whenever that
    port has sent buffers the host consumed and the guest has not reclaimed (virtio-mmio has one
    interrupt for all its queues), and only a write or a poll on the port reclaims them: a
    reader blocked in read() is woken, finds nothing, and sleeps again, on every interrupt of
    the REPL port, two guest context switches each (docs/architecture.md, "Exec latency on a
    slow TCG host"). A poll reclaims on its first wake-up, so the process sleeps through the
    next ones. The worker needs none: its own writes reclaim its port's buffers every exec.
    """
    buf = bytearray()
    skipping = False                 # inside an oversized line: drop up to its newline
    poller = None
    if wait_in_poll:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
    while True:
        if before_read is not None:
            before_read()
        if poller is not None:
            try:
                poller.poll()
            except OSError:
                pass                     # the read below says what is wrong
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
    try:
        # One write in the common case, without a memoryview: a fork child's hello answer is
        # written here, and every first run of code costs it under TCG
        written = os.write(fd, data)
    except BlockingIOError:              # an fd inherited in non-blocking mode
        wait_writable(fd)
        written = 0
    if written == len(data):
        return
    view = memoryview(data)[written:]
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:          # an fd inherited in non-blocking mode
            wait_writable(fd)


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


_HELLO_HEAD = [b"{", b"op", b":", b"hello", b",", b"nonce", b":"]
_HELLO_TIME = [b",", b"time_ns", b":"]
_HELLO_SEED = [b",", b"seed", b":"]
_HELLO_COPY = [b",", b"copy"]
_HELLO_COPIES = {b":true}": True, b":false}": False}


def parse_hello_fast(line):
    """(nonce, time_ns, seed, copy) of a hello exactly as hostd writes it, else None (then
    parse_line, the general path, takes the line):

        {"op":"hello","nonce":"<letters, digits>","time_ns":"<digits>","seed":"<64 hex>","copy":true}

    A fork child parses this one line between its restore and its answer, and under TCG every
    guest block it runs then is translated anew in each child: a split on quotes and a few
    comparisons of C objects run far less distinct code than json.loads (its Python wrapper,
    the C scanner, a regex for trailing whitespace, a dict). The nonce is ASCII letters and
    digits (hostd's are hex), so it goes back into the reply as it is, needing no escape;
    the seed is returned as bytes."""
    p = line.split(b'"')
    if (len(p) != 19 or p[:7] != _HELLO_HEAD or p[8:11] != _HELLO_TIME or p[12:15] != _HELLO_SEED
            or p[16:18] != _HELLO_COPY):
        return None
    nonce, time_ns, seed, copy = p[7], p[11], p[15], _HELLO_COPIES.get(p[18])
    if (copy is None or not nonce.isalnum() or not time_ns.isdigit() or len(time_ns) > 24
            or len(seed) != 64):
        return None
    try:
        raw = bytes.fromhex(seed.decode("ascii"))
    except ValueError:
        return None
    return nonce, int(time_ns), raw, copy


def parse_line(line):
    """A host message as a dict, or None for a line that is not one (noise before hello)."""
    try:
        msg = json.loads(line)
    except ValueError:
        msg = salvage_hello(line)
    return msg if isinstance(msg, dict) else None
