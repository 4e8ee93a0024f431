"""A minimal hostd side of the processes port, for the guest tests: the server under test runs in
a thread of the test process, on one end of a socket pair (a virtio port in a VM). Frames that
arrive are sorted by stream id, so a test can wait on one stream while others speak."""

import collections
import json
import os
import select
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import proc_server  # noqa: E402
from port_frames import (CREDIT, DATA, END, HEADER, JSON, MAX_PAYLOAD, SYNC,  # noqa: E402
                         SYNC_REPLY, frame)


class Failed(Exception):
    """An `error` answer, raised by the helpers that expect success."""

    def __init__(self, msg):
        super().__init__("%s: %s" % (msg.get("code"), msg.get("message")))
        self.code = msg.get("code")
        self.msg = msg


class StaticEnv:
    def __init__(self, env):
        self.env = env

    def current(self):
        return self.env


class ProcHost:
    def __init__(self, env=None):
        self.sock, guest = socket.socketpair()
        self.guest = guest
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        self.server = proc_server.Server(StaticEnv(env or base), stop_at_eof=True)
        self.thread = threading.Thread(target=self.server.serve, args=(guest.fileno(),),
                                       daemon=True)
        self.thread.start()
        self.buf = b""
        self.next_id = 1
        self.frames = collections.defaultdict(collections.deque)   # id -> (kind, payload)

    def close(self):
        self.sock.close()
        self.thread.join(10)
        self.guest.close()
        if self.thread.is_alive():
            raise AssertionError("the processes server did not stop at EOF")

    # ---- framing -------------------------------------------------------------------------

    def send(self, kind, frame_id, payload=b""):
        self.sock.sendall(frame(kind, frame_id, payload))

    def send_json(self, frame_id, msg):
        self.send(JSON, frame_id, json.dumps(msg).encode())

    def credit(self, frame_id, n):
        self.send(CREDIT, frame_id, struct.pack(">I", n))

    def _fill(self, timeout):
        ready = select.select([self.sock], [], [], timeout)[0]
        if not ready:
            raise AssertionError("nothing from the processes server within %.1f s" % timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise AssertionError("the processes server closed the port")
        self.buf += data

    def _read_frame(self, deadline):
        while len(self.buf) < HEADER.size:
            self._fill(max(0.01, deadline - time.monotonic()))
        kind, frame_id, length = HEADER.unpack_from(self.buf)
        while len(self.buf) < HEADER.size + length:
            self._fill(max(0.01, deadline - time.monotonic()))
        payload = self.buf[HEADER.size:HEADER.size + length]
        self.buf = self.buf[HEADER.size + length:]
        self.frames[frame_id].append((kind, json.loads(payload) if kind == JSON else payload))

    def recv(self, frame_id, timeout=10.0):
        """The next frame of stream frame_id: (kind, payload), JSON payloads decoded."""
        deadline = time.monotonic() + timeout
        while not self.frames[frame_id]:
            self._read_frame(deadline)
        return self.frames[frame_id].popleft()

    def hello(self, nonce="n1", timeout=10.0):
        self.sock.sendall(bytes(MAX_PAYLOAD + HEADER.size) + SYNC)
        self.send_json(0, {"op": "hello", "nonce": nonce})
        deadline = time.monotonic() + timeout
        while True:
            at = self.buf.find(SYNC_REPLY)
            if at >= 0:
                self.buf = self.buf[at + len(SYNC_REPLY):]
                self.frames.clear()
                kind, msg = self.recv(0, timeout)
                if kind == JSON and msg.get("nonce") == nonce:
                    return msg
                continue
            self.buf = self.buf[-len(SYNC_REPLY):]
            self._fill(max(0.01, deadline - time.monotonic()))

    # ---- requests ------------------------------------------------------------------------

    def new_id(self):
        frame_id, self.next_id = self.next_id, self.next_id + 1
        return frame_id

    def request(self, op, **fields):
        frame_id = self.new_id()
        fields["op"] = op
        self.send_json(frame_id, fields)
        return frame_id

    def call(self, op, **fields):
        """A request with one answer; Failed on an error."""
        kind, msg = self.recv(self.request(op, **fields))
        if msg.get("op") == "error":
            raise Failed(msg)
        return msg

    def start(self, cmd, *args, **fields):
        """Starts a process; returns (stream id, pid). Failed when it cannot start."""
        sub = self.request("start", cmd=cmd, args=list(args), **fields)
        kind, msg = self.recv(sub)
        if msg.get("op") == "error":
            raise Failed(msg)
        assert msg["op"] == "started", msg
        return sub, msg["pid"]

    def bash(self, code, **fields):
        return self.start("bash", "-c", code, **fields)

    def collect(self, sub, timeout=10.0):
        """Output of stream `sub` up to its end: (stdout, stderr, end)."""
        out = {1: bytearray(), 2: bytearray()}
        while True:
            kind, payload = self.recv(sub, timeout)
            if kind == DATA:
                out[payload[0]] += payload[1:]
            elif payload.get("op") == "end":
                return bytes(out[1]), bytes(out[2]), payload
            elif payload.get("op") == "error":
                raise Failed(payload)

    def run(self, code, **fields):
        sub, _ = self.bash(code, **fields)
        return self.collect(sub)

    def input(self, pid, data, chunk=MAX_PAYLOAD):
        frame_id = self.request("input", pid=pid)
        for i in range(0, len(data), chunk):
            self.send(DATA, frame_id, data[i:i + chunk])
        self.send(END, frame_id)
        kind, msg = self.recv(frame_id)
        if msg.get("op") == "error":
            raise Failed(msg)
        return msg

    def events(self, sub, until, timeout=10.0):
        """Events of watch stream `sub` until until(events) holds."""
        seen = []
        deadline = time.monotonic() + timeout
        while not until(seen):
            kind, msg = self.recv(sub, max(0.01, deadline - time.monotonic()))
            assert msg["op"] == "events", msg
            seen += msg["events"]
        return seen
