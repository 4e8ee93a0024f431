"""Binary framing of the `hostd.files` and `hostd.net` ports (guest/PROTOCOL.md, "Framed ports").

Both ports carry bytes that JSON lines cannot (file contents, TCP streams), so each message is
a frame: a 9-byte header (kind, id, payload length; big-endian) and the payload. JSON is only
used for the control frames (kind J); data frames carry raw bytes with no per-chunk encoding.

Resynchronisation. A VM restored from a snapshot, or a hostd that reconnects after a crash,
may leave this end in the middle of a frame the host will never finish. The host's hello is
therefore preceded by zero bytes, at least a whole frame's worth: whatever frame this end was
inside ends within them (the host never sends a payload longer than MAX_PAYLOAD, and a torn
header can only read a smaller length), and a zero byte where a frame would start is skipped
as padding. Then comes SYNC, which resets the reader, and the hello itself. Bytes that cannot
start a frame (a desync) make the reader discard everything up to the next SYNC. So no payload
byte is ever scanned for SYNC, and no file or TCP content can be mistaken for one.
The guest answers with SYNC_REPLY and a hello frame carrying the host's nonce; the host
discards everything before it.
"""

import os
import re
import struct
import threading

HEADER = struct.Struct(">BII")      # kind, id, payload length
MAX_PAYLOAD = 32 << 10              # longest payload the host sends (so: the padding it needs)
READ_SIZE = 256 << 10               # (a virtio port returns at most one 4 KiB buffer per read)
SYNC = bytes.fromhex("ff013f14365cddbe8fa23fee4b39adeb")        # host -> guest
SYNC_REPLY = bytes.fromhex("ff3353f7a29f6b44d2c46811a8dce4e5")  # guest -> host

JSON = 0x4A     # J: a control message, a UTF-8 JSON object
DATA = 0x44     # D: raw bytes of a transfer or a connection
END = 0x45      # E: the sender's side of a transfer or connection ended
OPEN = 0x4F     # O: (net) a new connection; payload: JSON
CLOSE = 0x43    # C: (net) a connection is over, both ways
CREDIT = 0x4B   # K: (net) the receiver consumed u32 bytes: the sender may send as many more

_NONZERO = re.compile(rb"[^\x00]")


class EofBackoff:
    """How long to wait before reading a port again after EOF. While hostd is not connected a
    virtio port reads EOF at once (poll cannot wait for the connection), so the port is
    polled: soon at first, then at most once a second, so that a VM whose hostd never
    connects this port does not wake up 20 times a second. hostd connects every port as the
    VM starts, so a running guest never waits here."""

    FIRST, LAST = 0.05, 1.0

    def __init__(self):
        self.delay = self.FIRST

    def next(self):
        delay = self.delay
        self.delay = min(self.LAST, self.delay * 2)
        return delay

    def reset(self):
        self.delay = self.FIRST


class Resync:
    """The event of a SYNC: the host is starting over; whatever was going on is void."""

    def __repr__(self):
        return "SYNC"


SYNC_EVENT = Resync()


def frame(kind, frame_id, payload=b""):
    return HEADER.pack(kind, frame_id, len(payload)) + payload


class FrameReader:
    """Turns the bytes read from a port into events: SYNC_EVENT, or (kind, id, payload).

    Frames of kinds not in `kinds`, or longer than max_payload, are a desync: everything up to
    the next SYNC is dropped. Memory is bounded by one frame plus one read."""

    def __init__(self, kinds, max_payload=MAX_PAYLOAD):
        self.kinds = frozenset(kinds)
        self.max_payload = max_payload
        self.buf = bytearray()
        self.scanning = False        # desynced: dropping bytes until a SYNC
        self.desyncs = 0             # how often that happened (tests, logs)
        self.scratch = memoryview(bytearray(READ_SIZE))

    def feed(self, data):
        self.buf += data

    def read_from(self, fd):
        """One read from fd into the reader; returns the byte count (0 at EOF). Reads into a
        buffer kept for the purpose: os.read would allocate (and fault in) READ_SIZE bytes per
        call, most of the cost of a read of a few KiB."""
        n = os.readv(fd, [self.scratch])
        self.buf += self.scratch[:n]
        return n

    def reset(self):
        """The host went away (EOF): what it sent half of will never be finished."""
        del self.buf[:]
        self.scanning = False

    def next(self):
        """The next complete event, or None until more bytes are fed."""
        buf = self.buf
        while True:
            if self.scanning:
                at = buf.find(SYNC)
                if at < 0:
                    del buf[:max(0, len(buf) - len(SYNC) + 1)]
                    return None
                del buf[:at]
                self.scanning = False
            match = _NONZERO.search(buf)     # zero bytes between frames are padding
            if match is None:
                del buf[:]
                return None
            del buf[:match.start()]
            if buf[0] == SYNC[0]:
                if len(buf) < len(SYNC):
                    if SYNC.startswith(bytes(buf)):
                        return None
                elif buf[:len(SYNC)] == SYNC:
                    del buf[:len(SYNC)]
                    return SYNC_EVENT
                self._desync()
                continue
            if len(buf) < HEADER.size:
                return None
            kind, frame_id, length = HEADER.unpack_from(buf)
            if kind not in self.kinds or length > self.max_payload:
                self._desync()
                continue
            end = HEADER.size + length
            if len(buf) < end:
                return None
            with memoryview(buf) as view:
                payload = bytes(view[HEADER.size:end])
            del buf[:end]
            return kind, frame_id, payload

    def _desync(self):
        self.desyncs += 1
        self.scanning = True
        del self.buf[:1]


def serve_port(open_port, name, serve, log, off):
    """Serves virtio port `name` from a daemon thread of the calling process (the agent), with
    serve(fd). open_port(name) opens a virtio port by name; a VM without this port logs that
    `off` (what it goes without) and goes on."""
    def run():
        try:
            fd = open_port(name)
        except OSError as e:
            log("no %s port, %s: %s" % (name, off, e))
            return
        os.set_inheritable(fd, False)
        serve(fd)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
