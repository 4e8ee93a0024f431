"""A minimal hostd side of the files port, for the guest tests: the server under test runs in a
thread of the test process, on one end of a socket pair (a virtio port in a VM)."""

import json
import os
import select
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import files_ops  # noqa: E402
import files_server  # noqa: E402
from port_frames import (DATA, END, HEADER, JSON, MAX_PAYLOAD, SYNC, SYNC_REPLY,  # noqa: E402
                         frame)


class Done(Exception):
    """A `done` frame with ok false, raised by the helpers that expect success."""

    def __init__(self, msg):
        super().__init__("%s: %s" % (msg.get("code"), msg.get("message")))
        self.code = msg.get("code")
        self.msg = msg


class FilesHost:
    def __init__(self):
        self.sock, guest = socket.socketpair()
        self.guest = guest
        self.server = files_server.Server(guest.fileno(), guest.fileno(), stop_at_eof=True)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.buf = b""
        self.next_id = 1

    def close(self):
        self.sock.close()
        self.thread.join(10)
        self.guest.close()
        if self.thread.is_alive():
            raise AssertionError("the files server did not stop at EOF")

    # ---- framing -------------------------------------------------------------------------

    def send(self, kind, frame_id, payload=b""):
        self.sock.sendall(frame(kind, frame_id, payload))

    def send_json(self, frame_id, msg):
        self.send(JSON, frame_id, json.dumps(msg).encode())

    def _fill(self, timeout):
        ready = select.select([self.sock], [], [], timeout)[0]
        if not ready:
            raise AssertionError("nothing from the files server within %.1f s" % timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise AssertionError("the files server closed the port")
        self.buf += data

    def recv(self, timeout=10.0):
        """The next frame: (kind, id, payload), JSON payloads decoded."""
        deadline = time.monotonic() + timeout
        while len(self.buf) < HEADER.size:
            self._fill(max(0.01, deadline - time.monotonic()))
        kind, frame_id, length = HEADER.unpack_from(self.buf)
        while len(self.buf) < HEADER.size + length:
            self._fill(max(0.01, deadline - time.monotonic()))
        payload = self.buf[HEADER.size:HEADER.size + length]
        self.buf = self.buf[HEADER.size + length:]
        return kind, frame_id, json.loads(payload) if kind == JSON else payload

    def hello(self, nonce="n1", timeout=10.0):
        """Padding, SYNC and hello, then everything up to the guest's answer is dropped."""
        self.sock.sendall(bytes(MAX_PAYLOAD + HEADER.size) + SYNC)
        self.send_json(0, {"op": "hello", "nonce": nonce})
        deadline = time.monotonic() + timeout
        while True:
            at = self.buf.find(SYNC_REPLY)
            if at >= 0:
                self.buf = self.buf[at + len(SYNC_REPLY):]
                kind, _, msg = self.recv(timeout)
                if kind == JSON and msg.get("nonce") == nonce:
                    return msg
                continue
            self.buf = self.buf[-len(SYNC_REPLY):]
            if time.monotonic() > deadline:
                raise AssertionError("no answer to the hello within %.1f s" % timeout)
            self._fill(max(0.01, deadline - time.monotonic()))

    # ---- operations ----------------------------------------------------------------------

    def start(self, op, **fields):
        op_id, self.next_id = self.next_id, self.next_id + 1
        fields["op"] = op
        self.send_json(op_id, fields)
        return op_id

    def done(self, op_id):
        """Frames of op_id up to its done: (head or None, data, done)."""
        head, data = None, bytearray()
        while True:
            kind, frame_id, payload = self.recv()
            if frame_id != op_id:
                raise AssertionError("frame of op %d while waiting for %d" % (frame_id, op_id))
            if kind == DATA:
                data += payload
            elif payload.get("op") == "head":
                head = payload
            else:
                return head, bytes(data), payload

    def call(self, op, **fields):
        _, _, done = self.done(self.start(op, **fields))
        if not done["ok"]:
            raise Done(done)
        return done

    def write(self, path, content, chunk=MAX_PAYLOAD, **fields):
        op_id = self.start("write", path=path, **fields)
        for i in range(0, len(content), chunk):
            self.send(DATA, op_id, content[i:i + chunk])
        self.send(END, op_id)
        _, _, done = self.done(op_id)
        if not done["ok"]:
            raise Done(done)
        return done

    def read(self, path):
        head, data, done = self.done(self.start("read", path=path))
        if not done["ok"]:
            raise Done(done)
        return head, data

    def tar_in(self, path, tar_bytes):
        op_id = self.start("tar_in", path=path)
        for i in range(0, len(tar_bytes), MAX_PAYLOAD):
            self.send(DATA, op_id, tar_bytes[i:i + MAX_PAYLOAD])
        self.send(END, op_id)
        _, _, done = self.done(op_id)
        if not done["ok"]:
            raise Done(done)
        return done
