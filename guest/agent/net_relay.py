#!/usr/bin/env python3
"""hostd guest network relay: the guest's only way out, over the `hostd.net` port
(guest/PROTOCOL.md, "Network port").

The guest has no network device. Programs reach the outside through an HTTP proxy at
127.0.0.1:3128 (PROXY_ENV points pip, git, curl, wget, requests and urllib at it), and the
host's own services through listeners on host.hostd.internal (10.0.2.2, on `lo`) for the ports
hostd allows there. This relay carries each accepted connection's bytes to hostd, multiplexed
on the port; hostd parses the proxy requests, applies the sandbox's rules and connects, so
root in the guest cannot widen them.

Flow control is per connection: each side may send at most WINDOW bytes that the other has
not yet consumed (CREDIT frames give them back), and both always read the port, so one
stalled connection never holds up another, and memory stays bounded (WINDOW per connection,
MAX_CONNS connections). One thread of the agent, one selector loop, non-blocking sockets.

Standalone, for tests:
  net_relay.py --listen SOCKET [--proxy-port N] [--internal-address A]  (serves one connection)
"""

import argparse
import errno
import json
import os
import select
import selectors
import socket
import struct
import sys
import time
import traceback

from port_frames import (CLOSE, CREDIT, DATA, END, HEADER, JSON, MAX_PAYLOAD, OPEN, SYNC_EVENT,
                         SYNC_REPLY, EofBackoff, FrameReader, frame, serve_port)

PORT_NAME = "hostd.net"
VERSION = 1
PROXY_ADDRESS = ("127.0.0.1", 3128)
INTERNAL_ADDRESS = "10.0.2.2"       # host.hostd.internal in the guest (/init puts it on lo)
PROXY_URL = "http://127.0.0.1:3128"
# Merged into the default environment of bash and the Python REPL (agent.py)
PROXY_ENV = {
    "HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL, "https_proxy": PROXY_URL,
    "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
}
WINDOW = 64 << 10           # unconsumed bytes one side may have in flight per connection
MAX_CONNS = 128
READ_ROUNDS = 16            # port reads per loop round: bounded work, the rest next round
_U32 = struct.Struct(">I")
_serving = None             # the Relay serving this agent's port (start), for quiet_state()


def log(*args):
    print("hostd-net:", *args, file=sys.stderr, flush=True)


def encode_json(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


class Conn:
    """One relayed connection: its socket, what hostd sent that it still has to write, and
    the credits of both directions."""

    __slots__ = ("id", "sock", "credit", "inbox", "unacked", "eof_in", "eof_out", "closing",
                 "mask")

    def __init__(self, conn_id, sock):
        self.id, self.sock = conn_id, sock
        self.credit = WINDOW        # bytes this end may still send to hostd
        self.inbox = bytearray()    # bytes from hostd not yet written to the socket
        self.unacked = 0            # bytes written to the socket, not yet given back as credit
        self.eof_in = False         # hostd's side ended (END)
        self.eof_out = False        # the socket's side ended: END sent
        self.closing = False        # hostd closed it (CLOSE): close once the inbox is written
        self.mask = 0               # selector events registered


class Relay:
    """Listens at once (the proxy); relays once serve() has the port."""

    def __init__(self, proxy_address=PROXY_ADDRESS, internal_address=INTERNAL_ADDRESS,
                 stop_at_eof=False):
        self.fd = None
        self.proxy_address = proxy_address
        self.internal_address = internal_address
        self.stop_at_eof = stop_at_eof
        self.sel = selectors.DefaultSelector()
        self.port_mask = 0
        self.port_down_until = None   # EOF seen: hostd is away until then
        self.backoff = EofBackoff()
        self.reader = FrameReader((JSON, DATA, END, CLOSE, CREDIT))
        self.out = bytearray()        # frames for hostd, written from offset `sent`
        self.sent = 0
        self.conns = {}
        self.next_id = 1
        self.proxy = None
        self.internal = {}            # port -> listening socket on internal_address
        self.port_poll = None         # (fd, select.poll on it) for quiet_state
        self.stopped = False
        self._listen_proxy()

    # ---- listeners ------------------------------------------------------------------------

    def _listen(self, address, on_accept):
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sel.register(sock, selectors.EVENT_READ, lambda _mask: on_accept(sock))
        return sock

    def _listen_proxy(self):
        if self.proxy is not None:
            return True
        try:
            self.proxy = self._listen(self.proxy_address, lambda s: self._accept(s, {}))
            return True
        except OSError as e:
            log("cannot listen on %s:%d: %s" % (self.proxy_address + (e,)))
            return False

    @property
    def proxy_port(self):
        return self.proxy.getsockname()[1] if self.proxy is not None else None

    def _configure(self, ports):
        """Listens on internal_address for exactly these ports (hostd's rules allow them)."""
        wanted = {p for p in ports if isinstance(p, int) and not isinstance(p, bool)
                  and 0 < p < 65536} if isinstance(ports, list) else set()
        for port in sorted(set(self.internal) - wanted):
            sock = self.internal.pop(port)
            self.sel.unregister(sock)
            sock.close()
        failed = []
        for port in sorted(wanted - set(self.internal)):
            try:
                self.internal[port] = self._listen(
                    (self.internal_address, port),
                    lambda s, port=port: self._accept(s, {"port": port}))
            except OSError as e:
                failed.append({"port": port, "error": e.strerror or str(e)})
        return {"ports": sorted(self.internal), "failed": failed,
                "proxy": self._listen_proxy()}

    def _accept(self, listener, open_msg):
        for _ in range(READ_ROUNDS):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:              # EMFILE and the like: try again next round
                log("accept failed:", e)
                return
            if (len(self.conns) >= MAX_CONNS or self.fd is None
                    or self.port_down_until is not None):
                _abort(sock)
                continue
            sock.setblocking(False)
            conn = Conn(self.next_id, sock)
            self.next_id = self.next_id + 1 if self.next_id < 0xFFFFFFFF else 1
            self.conns[conn.id] = conn
            self._send(OPEN, conn.id, encode_json(open_msg))
            self._update(conn)

    # ---- the loop -------------------------------------------------------------------------

    def quiet_state(self):
        """{"ports": [...]} when the relay holds no connection and nothing half-sent or
        half-read on the port, else None. Read from the agent's thread for its hello reply: a
        restored copy of a VM whose relay was quiet needs no reset, and hostd then skips the
        sync's round trip (under TCG, ~4,000 guest blocks translated anew in every fork child).
        Anything the relay does after this read is a new connection, in whole frames."""
        fd = self.fd
        if (fd is None or self.port_down_until is not None or self.proxy is None or self.conns
                or self.out or self.reader.buf or self.reader.scanning):
            return None
        try:
            # poll, not select: the agent's own wait for its port is a poll, so a fork child
            # runs the kernel's poll code already before its hello; select's was ~80 guest
            # blocks more to translate (docs/architecture.md, "Where a fork child's time goes")
            if self.port_poll is None or self.port_poll[0] != fd:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                self.port_poll = (fd, poller)
            if self.port_poll[1].poll(0):
                return None              # the host sent something this relay has not read
        except (OSError, ValueError):
            return None
        return {"ports": sorted(self.internal)}

    def quiet_state_json(self):
        """quiet_state() as the JSON bytes of the agent's hello reply."""
        state = self.quiet_state()
        if state is None:
            return b"null"
        return b'{"ports":[' + ",".join(map(str, state["ports"])).encode() + b"]}"

    def serve(self, fd):
        """Relays over port fd; returns at EOF with stop_at_eof, else never."""
        self.fd = fd
        os.set_blocking(fd, False)
        self.sel.register(fd, selectors.EVENT_READ, self._on_port)
        self.port_mask = selectors.EVENT_READ
        while not self.stopped:
            timeout = None
            if self.port_down_until is not None:
                timeout = max(0.0, self.port_down_until - time.monotonic())
                if timeout == 0.0:
                    self.port_down_until = None
                    self.sel.register(self.fd, selectors.EVENT_READ, self._on_port)
                    self.port_mask = selectors.EVENT_READ
                    continue
            for key, mask in self.sel.select(timeout):
                try:
                    key.data(mask)
                except Exception:
                    log("internal error:\n" + traceback.format_exc())
            self._flush_port()
        self._close_all()

    def _on_port(self, mask):
        if mask & selectors.EVENT_WRITE:
            self._flush_port()
        if not mask & selectors.EVENT_READ:
            return
        for _ in range(READ_ROUNDS):
            try:
                n = self.reader.read_from(self.fd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno != errno.ECONNRESET:      # (a test's socket pair) hostd is gone
                    log("port read failed:", e)
                n = 0
            if n == 0:
                return self._host_gone()
            self.backoff.reset()
            while True:
                ev = self.reader.next()
                if ev is None:
                    break
                self._on_frame(ev)

    def _host_gone(self):
        """EOF: hostd closed the port (it went away, or the VM is being torn down)."""
        self.reader.reset()
        self._reset()
        if self.stop_at_eof:
            self.stopped = True
            return
        self.sel.unregister(self.fd)
        self.port_mask = 0
        self.port_down_until = time.monotonic() + self.backoff.next()

    def _reset(self):
        """hostd starts over (a hello after a restore, or EOF): every connection is void."""
        for conn in list(self.conns.values()):
            self._drop(conn, abort=True)
        self._discard()

    def _on_frame(self, ev):
        if ev is SYNC_EVENT:
            return self._reset()
        kind, conn_id, payload = ev
        if kind == JSON:
            return self._on_control(payload)
        conn = self.conns.get(conn_id)
        if conn is None:
            return                            # closed here meanwhile: its CLOSE is on its way
        if kind == DATA:
            if len(conn.inbox) + len(payload) > WINDOW:
                log("connection %d: hostd sent beyond its credit" % conn_id)
                return self._drop(conn, abort=True, tell=True)
            conn.inbox += payload
            self._write_conn(conn)
        elif kind == END:
            conn.eof_in = True
            self._write_conn(conn)
        elif kind == CLOSE:
            conn.closing = True
            self._write_conn(conn)
        elif kind == CREDIT and len(payload) == 4:
            conn.credit += _U32.unpack(payload)[0]
            self._update(conn)

    def _on_control(self, payload):
        try:
            msg = json.loads(payload)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            return log("malformed control message dropped")
        if msg.get("op") == "hello":
            reply = {"op": "hello", "nonce": msg.get("nonce"), "version": VERSION}
            reply.update(self._configure(msg.get("ports", [])))
            self._discard()                   # hostd discards everything before the reply
            self.out += SYNC_REPLY
            self.out += frame(JSON, 0, encode_json(reply))
        elif msg.get("op") == "config":
            reply = {"op": "config"}
            reply.update(self._configure(msg.get("ports", [])))
            self._send(JSON, 0, encode_json(reply))

    # ---- connections ----------------------------------------------------------------------

    def _update(self, conn):
        """Registers for what the connection can do now: read while it has credit, write
        while its inbox holds bytes."""
        mask = 0
        if conn.credit > 0 and not conn.eof_out:
            mask |= selectors.EVENT_READ
        if conn.inbox:
            mask |= selectors.EVENT_WRITE
        if mask == conn.mask:
            return
        if conn.mask == 0:
            self.sel.register(conn.sock, mask, lambda m, c=conn: self._on_conn(c, m))
        elif mask == 0:
            self.sel.unregister(conn.sock)
        else:
            self.sel.modify(conn.sock, mask, lambda m, c=conn: self._on_conn(c, m))
        conn.mask = mask

    def _on_conn(self, conn, mask):
        if mask & selectors.EVENT_WRITE:
            self._write_conn(conn)
        if mask & selectors.EVENT_READ and self.conns.get(conn.id) is conn:
            self._read_conn(conn)

    def _read_conn(self, conn):
        try:
            data = conn.sock.recv(min(conn.credit, MAX_PAYLOAD))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._drop(conn, abort=True, tell=True)
        if data:
            conn.credit -= len(data)
            self._send(DATA, conn.id, data)
        else:
            conn.eof_out = True
            self._send(END, conn.id)
            self._maybe_done(conn)
        if self.conns.get(conn.id) is conn:
            self._update(conn)

    def _write_conn(self, conn):
        if conn.inbox:
            try:
                n = conn.sock.send(conn.inbox)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return self._drop(conn, abort=True, tell=not conn.closing)
            del conn.inbox[:n]
            conn.unacked += n
            # Credit goes back in batches, and at once when the inbox is empty (hostd may be
            # waiting for it to send the rest of a small response)
            if conn.unacked and (conn.unacked >= WINDOW // 4 or not conn.inbox):
                self._send(CREDIT, conn.id, _U32.pack(conn.unacked))
                conn.unacked = 0
        if not conn.inbox:
            if conn.closing:
                return self._drop(conn)
            if conn.eof_in:
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self._maybe_done(conn)
        if self.conns.get(conn.id) is conn:
            self._update(conn)

    def _maybe_done(self, conn):
        """Both sides ended and everything is written: nothing more can happen."""
        if conn.eof_in and conn.eof_out and not conn.inbox:
            self._drop(conn)

    def _drop(self, conn, abort=False, tell=False):
        if self.conns.pop(conn.id, None) is None:
            return
        if conn.mask:
            self.sel.unregister(conn.sock)
        if abort:
            _abort(conn.sock)
        else:
            conn.sock.close()
        if tell:
            self._send(CLOSE, conn.id)

    def _close_all(self):
        for conn in list(self.conns.values()):
            self._drop(conn, abort=True)
        for sock in [self.proxy] + list(self.internal.values()):
            if sock is not None:
                self.sel.unregister(sock)
                sock.close()
        self.proxy, self.internal = None, {}
        self.sel.close()

    # ---- the port -------------------------------------------------------------------------

    def _send(self, kind, conn_id, payload=b""):
        self.out += HEADER.pack(kind, conn_id, len(payload))
        self.out += payload

    def _discard(self):
        del self.out[:]
        self.sent = 0

    def _flush_port(self):
        """Writes what it can. From an offset, emptied only once all of it is out: deleting
        each partial write's bytes from the front made every later append move the rest."""
        if self.fd is None or self.port_down_until is not None:
            return self._discard()
        while self.sent < len(self.out):
            try:
                with memoryview(self.out) as view:
                    self.sent += os.write(self.fd, view[self.sent:])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log("port write failed:", e)
                self._discard()
        if self.sent == len(self.out):
            self._discard()
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
        if mask != self.port_mask:
            self.sel.modify(self.fd, mask, self._on_port)
            self.port_mask = mask


def _abort(sock):
    """Closes with a reset: the client sees its connection fail, not a clean end."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def start(open_port):
    """Serves the net port from a thread of the agent (port_frames.serve_port)."""
    def serve(fd):
        global _serving
        relay = Relay()
        _serving = relay
        relay.serve(fd)
    return serve_port(open_port, PORT_NAME, serve, log, "the network is off")


def quiet_state():
    """The serving relay's quiet_state(), for the agent's hello reply; None without one."""
    relay = _serving
    return relay.quiet_state() if relay is not None else None


def quiet_state_json():
    """quiet_state() as the JSON bytes of the agent's hello reply."""
    relay = _serving
    return relay.quiet_state_json() if relay is not None else b"null"


def main(argv=None):
    parser = argparse.ArgumentParser(description="hostd net relay (tests)")
    parser.add_argument("--listen", required=True, metavar="SOCKET",
                        help="unix socket to accept hostd's connection on, as QEMU would")
    parser.add_argument("--proxy-port", type=int, default=PROXY_ADDRESS[1])
    parser.add_argument("--internal-address", default=INTERNAL_ADDRESS)
    args = parser.parse_args(argv)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.listen)
    server.listen(1)
    # Listening first, so that the test knows the proxy's port before hostd connects
    relay = Relay(("127.0.0.1", args.proxy_port), args.internal_address, stop_at_eof=True)
    print(json.dumps({"listening": args.listen, "proxy_port": relay.proxy_port,
                      "pid": os.getpid()}), flush=True)
    conn, _ = server.accept()
    server.close()
    with conn:
        relay.serve(conn.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
