"""Behaviour of the guest's network relay (guest/PROTOCOL.md, "Network port"): the relay runs
in a thread on one end of a socket pair (the `hostd.net` port), and the test plays hostd on
the other end and the guest's programs on its listening sockets.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import json
import os
import select
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import net_relay  # noqa: E402
from port_frames import (CLOSE, CREDIT, DATA, END, HEADER, JSON, MAX_PAYLOAD, OPEN,  # noqa: E402
                         SYNC, SYNC_REPLY, frame)

U32 = struct.Struct(">I")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.005)


class NetHost:
    """hostd's end of the port, and the relay under test in a thread."""

    def __init__(self):
        self.sock, guest = socket.socketpair()
        self.guest = guest
        self.relay = net_relay.Relay(("127.0.0.1", 0), "127.0.0.1", stop_at_eof=True)
        self.thread = threading.Thread(target=self.relay.serve, args=(guest.fileno(),),
                                       daemon=True)
        self.thread.start()
        self.buf = b""

    def close(self):
        self.sock.close()
        self.thread.join(10)
        self.guest.close()
        if self.thread.is_alive():
            raise AssertionError("the relay did not stop at EOF")

    def send(self, kind, conn_id, payload=b""):
        self.sock.sendall(frame(kind, conn_id, payload))

    def send_data(self, conn_id, data):
        for i in range(0, len(data), MAX_PAYLOAD):
            self.send(DATA, conn_id, data[i:i + MAX_PAYLOAD])

    def _fill(self, deadline):
        if not select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise AssertionError("nothing from the relay in time")
        data = self.sock.recv(1 << 20)
        if not data:
            raise AssertionError("the relay closed the port")
        self.buf += data

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while len(self.buf) < HEADER.size:
            self._fill(deadline)
        kind, conn_id, length = HEADER.unpack_from(self.buf)
        while len(self.buf) < HEADER.size + length:
            self._fill(deadline)
        payload = self.buf[HEADER.size:HEADER.size + length]
        self.buf = self.buf[HEADER.size + length:]
        return kind, conn_id, json.loads(payload) if kind in (JSON, OPEN) else payload

    def pending(self):
        return bool(self.buf) or bool(select.select([self.sock], [], [], 0)[0])

    def available(self):
        """The frames already sent by the relay (none when it sent nothing yet)."""
        frames = []
        while self.pending():
            if not select.select([self.sock], [], [], 0)[0] and len(self.buf) < HEADER.size:
                break
            frames.append(self.recv())
        return frames

    def expect(self, kind, conn_id=None):
        """The next frame, which must be of `kind` (CREDIT frames are skipped unless asked)."""
        while True:
            got = self.recv()
            if got[0] == CREDIT and kind != CREDIT:
                continue
            self.t = got
            assert got[0] == kind and conn_id in (None, got[1]), "expected %r, got %r" % (
                (chr(kind), conn_id), (chr(got[0]), got[1], got[2]))
            return got

    def hello(self, nonce="n", **fields):
        self.sock.sendall(bytes(MAX_PAYLOAD + HEADER.size) + SYNC)
        self.send(JSON, 0, json.dumps(dict(fields, op="hello", nonce=nonce)).encode())
        deadline = time.monotonic() + 10
        while SYNC_REPLY not in self.buf:
            self._fill(deadline)
        self.buf = self.buf[self.buf.index(SYNC_REPLY) + len(SYNC_REPLY):]
        return self.recv()[2]

    def client(self, port=None):
        """A guest program's connection (to the proxy by default); returns (socket, conn id)."""
        sock = socket.create_connection(("127.0.0.1", port or self.relay.proxy_port))
        _, conn_id, msg = self.expect(OPEN)
        return sock, conn_id, msg


class RelayTestCase(unittest.TestCase):
    def setUp(self):
        self.host = NetHost()
        self.addCleanup(lambda: self.host.close())

    def recv_exactly(self, sock, n):
        data = b""
        sock.settimeout(10)
        while len(data) < n:
            piece = sock.recv(n - len(data))
            if not piece:
                break
            data += piece
        return data


class Hello(RelayTestCase):
    def test_hello_answers_its_nonce_and_listens_on_the_allowed_host_ports(self):
        port = free_port()
        msg = self.host.hello("abc", ports=[port])
        self.assertEqual((msg["op"], msg["nonce"], msg["ports"], msg["failed"], msg["proxy"]),
                         ("hello", "abc", [port], [], True))
        sock, _, open_msg = self.host.client(port)
        self.assertEqual(open_msg, {"port": port})
        sock.close()

    def test_a_config_message_changes_the_host_ports(self):
        first, second = free_port(), free_port()
        self.host.hello(ports=[first])
        self.host.send(JSON, 0, json.dumps({"op": "config", "ports": [second]}).encode())
        self.assertEqual(self.host.expect(JSON)[2]["ports"], [second])
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", first)).close()
        self.host.client(second)[0].close()

    def test_a_port_that_cannot_be_listened_on_is_reported(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            msg = self.host.hello(ports=[port, "x", 0, 70000])
        self.assertEqual((msg["ports"], [f["port"] for f in msg["failed"]]), ([], [port]))


class Relaying(RelayTestCase):
    def setUp(self):
        super().setUp()
        self.host.hello()

    def test_bytes_flow_both_ways_and_each_side_ends_its_own_direction(self):
        sock, conn_id, msg = self.host.client()
        self.assertEqual(msg, {})
        sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        self.assertEqual(self.host.expect(DATA, conn_id)[2],
                         b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        self.host.send(DATA, conn_id, b"HTTP/1.1 200 OK\r\n\r\n")
        self.host.send(END, conn_id)
        self.assertEqual(self.recv_exactly(sock, 100), b"HTTP/1.1 200 OK\r\n\r\n")
        sock.sendall(b"after the host's end")        # half-closed: this direction still works
        self.assertEqual(self.host.expect(DATA, conn_id)[2], b"after the host's end")
        sock.shutdown(socket.SHUT_WR)
        self.host.expect(END, conn_id)
        wait_for(lambda: conn_id not in self.host.relay.conns, "the connection to be dropped")
        sock.close()

    def test_a_close_from_hostd_delivers_what_came_before_it(self):
        sock, conn_id, _ = self.host.client()
        self.host.send(DATA, conn_id, b"HTTP/1.1 403 Forbidden\r\n\r\nno")
        self.host.send(CLOSE, conn_id)
        self.assertEqual(self.recv_exactly(sock, 1000), b"HTTP/1.1 403 Forbidden\r\n\r\nno")
        sock.close()

    def test_a_client_that_resets_is_closed_towards_hostd(self):
        sock, conn_id, _ = self.host.client()
        net_relay._abort(sock)
        self.host.expect(CLOSE, conn_id)

    def test_the_relay_sends_no_more_than_its_credit(self):
        sock, conn_id, _ = self.host.client()
        sock.sendall(b"x" * (net_relay.WINDOW * 3))
        got = 0
        while got < net_relay.WINDOW:
            kind, _, payload = self.host.expect(DATA, conn_id)
            self.assertLessEqual(len(payload), MAX_PAYLOAD)
            got += len(payload)
        self.assertEqual(got, net_relay.WINDOW)
        conn = self.host.relay.conns[conn_id]
        wait_for(lambda: conn.credit == 0 and conn.mask & 1 == 0, "the relay to stop reading")
        self.host.send(CREDIT, conn_id, U32.pack(1000))
        self.assertEqual(len(self.host.expect(DATA, conn_id)[2]), 1000)
        sock.close()

    def test_credit_comes_back_as_the_client_takes_the_bytes(self):
        sock, conn_id, _ = self.host.client()
        self.host.send(DATA, conn_id, b"a" * 20000)
        _, _, payload = self.host.expect(CREDIT, conn_id)
        self.assertEqual(U32.unpack(payload)[0], 20000)
        self.assertEqual(self.recv_exactly(sock, 20000), b"a" * 20000)
        sock.close()

    def test_a_stalled_connection_does_not_hold_up_another(self):
        stalled, stalled_id, _ = self.host.client()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = self.host.relay.conns[stalled_id]
        # hostd keeps sending within its credit until the kernel's buffers are full and the
        # relay holds bytes the client does not take
        credit = 0
        while not conn.inbox:
            self.host.send_data(stalled_id, b"s" * (net_relay.WINDOW - credit))
            credit = net_relay.WINDOW
            wait_for(lambda: conn.inbox or self.host.pending(), "the relay to take it")
            credit -= sum(U32.unpack(p)[0] for k, i, p in self.host.available() if k == CREDIT)
        other, other_id, _ = self.host.client()
        other.sendall(b"ping")
        self.assertEqual(self.host.expect(DATA, other_id)[2], b"ping")
        self.host.send(DATA, other_id, b"pong")
        self.assertEqual(self.recv_exactly(other, 4), b"pong")
        stalled.close()
        other.close()

    def test_hostd_sending_beyond_the_credit_closes_the_connection(self):
        sock, conn_id, _ = self.host.client()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = self.host.relay.conns[conn_id]
        for _ in range(200):                 # far more than the window
            self.host.send(DATA, conn_id, b"z" * MAX_PAYLOAD)
            if conn_id not in self.host.relay.conns:
                break
        self.host.expect(CLOSE, conn_id)
        self.assertNotIn(conn_id, self.host.relay.conns)
        self.assertLessEqual(len(conn.inbox), net_relay.WINDOW)
        sock.close()

    def test_a_hello_resets_every_connection(self):
        sock, conn_id, _ = self.host.client()
        self.host.hello("again")
        sock.settimeout(10)
        with self.assertRaises(ConnectionResetError):
            sock.recv(10)
        self.assertEqual(self.host.relay.conns, {})
        sock.close()

    def test_connections_beyond_the_limit_are_refused(self):
        clients = [self.host.client() for _ in range(net_relay.MAX_CONNS)]
        extra = socket.create_connection(("127.0.0.1", self.host.relay.proxy_port))
        extra.settimeout(10)
        with self.assertRaises(ConnectionResetError):
            extra.recv(10)
        extra.close()
        for sock, _, _ in clients:
            sock.close()


class QuietState(RelayTestCase):
    """What the agent's hello reply says of the relay: hostd skips the reset of a restored
    copy whose relay was quiet, so "quiet" must mean that nothing of another VM is held."""

    def quiet(self):
        """The relay's state once it has finished writing what it answered (until then, the
        rest of that answer is half-sent: not quiet)."""
        wait_for(lambda: self.host.relay.fd is not None and not self.host.relay.out,
                 "the relay to serve and write out its answers")
        return self.host.relay.quiet_state()

    def test_a_relay_that_holds_nothing_is_quiet_and_names_its_host_ports(self):
        self.assertEqual(self.quiet(), {"ports": []})
        port = free_port()
        self.host.hello(ports=[port])
        self.assertEqual(self.quiet(), {"ports": [port]})

    def test_a_relay_holding_a_connection_is_not_quiet_until_it_is_reset(self):
        sock, _, _ = self.host.client()
        self.assertIsNone(self.quiet())
        self.host.hello("again")
        self.assertEqual(self.quiet(), {"ports": []})
        sock.close()

    def test_bytes_from_the_host_not_yet_read_make_it_not_quiet(self):
        # A relay that does not serve (no thread reads its port): what the host sends waits.
        host, guest = socket.socketpair()
        self.addCleanup(host.close)
        self.addCleanup(guest.close)
        relay = net_relay.Relay(("127.0.0.1", 0), "127.0.0.1")
        self.addCleanup(relay.proxy.close)
        relay.fd = guest.fileno()
        self.assertEqual(relay.quiet_state(), {"ports": []})
        host.sendall(frame(CREDIT, 7, U32.pack(1)))
        self.assertIsNone(relay.quiet_state())

    def test_half_a_frame_read_makes_it_not_quiet(self):
        self.quiet()
        self.host.sock.sendall(frame(CREDIT, 7, U32.pack(1))[:5])
        wait_for(lambda: self.host.relay.reader.buf, "the relay to read the bytes")
        self.assertIsNone(self.host.relay.quiet_state())

    def test_a_relay_without_its_port_is_not_quiet(self):
        relay = net_relay.Relay(("127.0.0.1", 0), "127.0.0.1")
        self.addCleanup(relay.proxy.close)
        self.assertIsNone(relay.quiet_state())


class ProxyEnvironment(unittest.TestCase):
    def test_http_clients_are_pointed_at_the_proxy_and_local_addresses_bypass_it(self):
        env = net_relay.PROXY_ENV
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            self.assertEqual(env[name], "http://127.0.0.1:3128")
        self.assertEqual(env["NO_PROXY"], env["no_proxy"])
        self.assertEqual(set(env["no_proxy"].split(",")), {"localhost", "127.0.0.1", "::1"})


if __name__ == "__main__":
    unittest.main()
