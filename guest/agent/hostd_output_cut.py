"""Output of an exec as `out` messages: a stream cut into one message per line, long lines in
pieces of at most MAX_PIECE bytes, never inside a UTF-8 character; and how much of a pipe to
drain once its writer is done.
"""

import fcntl
import json

MAX_PIECE = 65536           # at most this many bytes of output per `out` message
DRAIN_LIMIT = 1 << 20       # bytes read from a pipe beyond what it held (orphans may write forever)
F_GETPIPE_SZ = 1032         # Linux: a pipe's capacity (user code may have grown it)


def drain_budget(fd):
    """How much to read from a pipe when its writer is done: all it holds (user code may have
    grown it), plus at most DRAIN_LIMIT more (orphans may write forever)."""
    try:
        return fcntl.fcntl(fd, F_GETPIPE_SZ) + DRAIN_LIMIT
    except OSError:
        return DRAIN_LIMIT


def utf8_cut(buf, start, end):
    """Where to cut buf near `end` (> start) so that no UTF-8 character is split."""
    for cut in range(end, max(start, end - 4), -1):
        if buf[cut] & 0xC0 != 0x80:     # not a continuation byte: a character starts here
            return cut
    return end                          # not UTF-8 anyway; any cut is as good


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
