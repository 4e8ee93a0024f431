#!/usr/bin/env python3
"""hostd guest processes server: serves the `hostd.proc` port (guest/PROTOCOL.md, "Processes
port"): processes started, listed, signalled, fed input and reconnected to, and directories
watched, each a stream multiplexed on the port by its frame id.

One thread of the agent, one selector loop (selector_loop.py), so the agent's exec queue never
waits for it and it never waits for an exec. Output is forwarded as bytes in data frames; each
stream has a credit (WINDOW bytes hostd has not yet consumed), and a process whose subscribers
have no credit left is not read, so a slow client slows its process down instead of filling
memory. A process with no subscriber has its output read and dropped (a late `connect` gets
what comes next, nothing earlier). Processes outlive the streams that started them: a client
that goes away, a pause, a fork (the child has them too) or a new hostd keep them running;
every new host connection (a hello here, or the agent's hello: proc_server.host_changed())
drops every stream of the old one.

Standalone, for tests:  proc_server.py --listen SOCKET  (serves one connection).
"""

import argparse
import errno
import json
import os
import signal
import socket
import struct
import sys
import traceback

import guest_users
from dir_watch import DirWatch, WatchError
from files_user import stat_detail
from files_ops import OpError, check_path
from port_frames import (CREDIT, DATA, END, HEADER, JSON, SYNC_EVENT, SYNC_REPLY, EofBackoff,
                         FrameReader, frame, serve_port)
from proc_manager import InputError, ProcessManager, StartError, MAX_INPUT
from selector_loop import Loop
from selectors import EVENT_READ, EVENT_WRITE

PORT_NAME = "hostd.proc"
VERSION = 1
WINDOW = 256 << 10          # bytes of a stream hostd has not consumed yet
OUT_HIGH = 1 << 20          # stop reading processes while this much waits for the port
READ_ROUNDS = 16            # port reads per loop round
SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
           signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGSTOP}
_U32 = struct.Struct(">I")
_serving = None             # the Server of this agent's port (start), for host_changed()


def log(*args):
    print("hostd-proc:", *args, file=sys.stderr, flush=True)


def encode_json(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "backslashreplace")


class Sub:
    """A stream to hostd: a process's output (`proc`) or a directory's events (`watch`)."""

    __slots__ = ("id", "proc", "watch", "credit", "entries")

    def __init__(self, sub_id, proc=None, watch=None, entries=False):
        self.id, self.proc, self.watch, self.entries = sub_id, proc, watch, entries
        self.credit = WINDOW


class Server:
    def __init__(self, env=None, cgroups=None, stop_at_eof=False):
        self.loop = Loop(log)
        self.stop_at_eof = stop_at_eof
        self.fd = None
        self.port_down = False
        self.backoff = EofBackoff()
        self.reader = FrameReader((JSON, DATA, END, CREDIT))
        self.out = bytearray()       # frames for hostd, written from offset `sent`
        self.sent = 0
        self.subs = {}               # id -> Sub
        self.inputs = {}             # id -> [pid, bytearray]: an input request being received
        self.manager = ProcessManager(self.loop, env, cgroups or _NoCgroups(), log,
                                      self._on_output, self._on_end)
        self.manager.budget = self._budget

    # ---- the port -------------------------------------------------------------------------

    def serve(self, fd):
        """Serves port fd; returns at EOF with stop_at_eof, else never."""
        self.fd = fd
        os.set_blocking(fd, False)
        self.loop.want(fd, EVENT_READ, self._on_readable)
        self.loop.run()
        for sub in list(self.subs.values()):
            self._drop(sub)
        self.manager.kill_all()

    def host_changed(self):
        """From any thread: a new host connection began (the agent's hello): every stream of
        the old one is void. Acted on before anything more is read from the port. With no
        stream open there is nothing to drop, and the thread is not woken: the agent's hello
        in a restored VM (a fork child) stays as cheap as it was."""
        if self.subs or self.inputs or self.out:
            self.loop.post(self._reset)

    def _on_readable(self):
        for _ in range(READ_ROUNDS):
            try:
                n = self.reader.read_from(self.fd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno != errno.ECONNRESET:
                    log("port read failed:", e)
                n = 0
            if n == 0:
                return self._host_gone()
            self.backoff.reset()
            while True:
                ev = self.reader.next()
                if ev is None:
                    break
                try:
                    self._on_frame(ev)
                except Exception as e:      # a bug must not take the port down
                    log("internal error:\n" + traceback.format_exc())
                    if ev is not SYNC_EVENT and ev[0] == JSON:
                        self._error(ev[1], "io_error", "internal error: %s" % e)

    def _host_gone(self):
        """EOF: hostd closed the port. It reads EOF until hostd reconnects: poll for that."""
        self.reader.reset()
        self._reset()
        if self.stop_at_eof:
            self.loop.stopped = True
            return
        self.loop.forget(self.fd)
        self.port_down = True

        def retry():
            self.port_down = False
            self.loop.want(self.fd, EVENT_READ, self._on_readable)
        self.loop.call_later(self.backoff.next(), retry)

    def _reset(self):
        for sub in list(self.subs.values()):
            self._drop(sub)
        self.inputs.clear()
        self._discard()

    def _send(self, kind, frame_id, payload=b""):
        if self.fd is None or self.port_down:
            return
        self.out += HEADER.pack(kind, frame_id, len(payload))
        self.out += payload
        if len(self.out) - self.sent >= 64 << 10:
            self._flush()
        else:
            # Written once the port is writable: with whatever else this round produces
            self.loop.want(self.fd, EVENT_WRITE, self._flush)

    def _send_json(self, frame_id, msg):
        payload = encode_json(msg)
        self._send(JSON, frame_id, payload)
        return len(payload)

    def _discard(self):
        del self.out[:]
        self.sent = 0
        if self.fd is not None and not self.port_down:
            self.loop.unwant(self.fd, EVENT_WRITE)

    def _flush(self):
        was_high = len(self.out) - self.sent > OUT_HIGH
        while self.sent < len(self.out):
            try:
                with memoryview(self.out) as view:
                    self.sent += os.write(self.fd, view[self.sent:])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log("port write failed:", e)
                return self._discard()
        if self.sent == len(self.out):
            self._discard()
        else:
            self.loop.want(self.fd, EVENT_WRITE, self._flush)
        if was_high and len(self.out) - self.sent <= OUT_HIGH:
            self._refresh_all()

    # ---- frames ---------------------------------------------------------------------------

    def _on_frame(self, ev):
        if ev is SYNC_EVENT:
            return self._reset()
        kind, frame_id, payload = ev
        if kind == CREDIT:
            sub = self.subs.get(frame_id)
            if sub is not None and len(payload) == 4:
                sub.credit += _U32.unpack(payload)[0]
                self._refresh(sub)
            return
        if kind in (DATA, END):
            return self._on_input_frame(kind, frame_id, payload)
        try:
            msg = json.loads(payload)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            return log("malformed request dropped: %r" % (payload[:200],))
        op = msg.get("op")
        handler = {"hello": self._hello, "start": self._start, "connect": self._connect,
                   "detach": self._detach, "list": self._list, "input": self._input,
                   "close_stdin": self._close_stdin, "signal": self._signal,
                   "watch": self._watch}.get(op)
        if handler is None:
            return self._error(frame_id, "bad_request", "unknown op %r" % (op,))
        handler(frame_id, msg)

    def _error(self, frame_id, code, message, **fields):
        fields.update(op="error", code=code, message=message)
        self._send_json(frame_id, fields)

    def _ok(self, frame_id, **fields):
        fields["op"] = "ok"
        self._send_json(frame_id, fields)

    def _hello(self, frame_id, msg):
        self._reset()
        if self.fd is None or self.port_down:
            return
        self.out += SYNC_REPLY
        self.out += frame(JSON, 0, encode_json({"op": "hello", "nonce": msg.get("nonce"),
                                                "version": VERSION, "pid": os.getpid()}))
        self._flush()

    # ---- processes ------------------------------------------------------------------------

    def _start(self, sub_id, msg):
        if sub_id in self.subs:
            return self._error(sub_id, "bad_request", "stream %d is open" % sub_id)
        try:
            proc = self.manager.start(msg)
        except StartError as e:
            return self._error(sub_id, e.code, e.message, **e.fields)
        self._subscribe(sub_id, proc)

    def _connect(self, sub_id, msg):
        if sub_id in self.subs:
            return self._error(sub_id, "bad_request", "stream %d is open" % sub_id)
        proc = self.manager.find(msg)
        if proc is None:
            ended = self.manager.find_ended(msg)
            if ended is None:
                return self._error(sub_id, "not_found", "process %s not found" % _named(msg))
            self._send_json(sub_id, {"op": "started", "pid": ended.pid})
            self._send_json(sub_id, dict(ended.end, op="end"))
            return
        self._subscribe(sub_id, proc)

    def _subscribe(self, sub_id, proc):
        sub = Sub(sub_id, proc=proc)
        self.subs[sub_id] = sub
        proc.subs.append(sub)
        self._send_json(sub_id, {"op": "started", "pid": proc.pid})
        self.manager.refresh(proc)

    def _budget(self, proc):
        if len(self.out) - self.sent > OUT_HIGH:
            return 0
        if not proc.subs:
            return 1 << 30               # nobody listens: read and drop
        return min(sub.credit for sub in proc.subs) - 1   # the stream byte counts too

    def _on_output(self, proc, stream, data):
        for sub in proc.subs:
            sub.credit -= len(data) + 1
            self._send(DATA, sub.id, bytes((stream,)) + data)

    def _on_end(self, proc):
        end = dict(proc.end, op="end")
        for sub in list(proc.subs):
            self._send_json(sub.id, end)
            self.subs.pop(sub.id, None)
        proc.subs = []

    def _detach(self, sub_id, msg):
        sub = self.subs.get(sub_id)
        if sub is not None:
            self._drop(sub)

    def _drop(self, sub):
        self.subs.pop(sub.id, None)
        if sub.proc is not None:
            if sub in sub.proc.subs:
                sub.proc.subs.remove(sub)
            self.manager.refresh(sub.proc)
        if sub.watch is not None:
            self.loop.forget(sub.watch.fd)
            sub.watch.close()

    def _refresh(self, sub):
        if sub.proc is not None:
            self.manager.refresh(sub.proc)
        elif sub.watch is not None:
            self._arm_watch(sub)

    def _refresh_all(self):
        for proc in list(self.manager.live.values()):
            self.manager.refresh(proc)
        for sub in list(self.subs.values()):
            if sub.watch is not None:
                self._arm_watch(sub)

    def _list(self, frame_id, msg):
        self._send_json(frame_id, {"op": "list", "processes": self.manager.list()})

    def _target(self, frame_id, msg):
        proc = self.manager.find(msg)
        if proc is None:
            self._error(frame_id, "not_found", "process %s not found" % _named(msg))
        return proc

    def _input(self, frame_id, msg):
        self.inputs[frame_id] = [msg, bytearray()]

    def _on_input_frame(self, kind, frame_id, payload):
        pending = self.inputs.get(frame_id)
        if pending is None:
            return                       # of a request already answered (or an old host's)
        if kind == DATA:
            if len(pending[1]) + len(payload) > MAX_INPUT:
                del self.inputs[frame_id]
                return self._error(frame_id, "invalid_argument",
                                   "input over %d bytes in one request" % MAX_INPUT)
            pending[1] += payload
            return
        del self.inputs[frame_id]
        msg, data = pending
        proc = self._target(frame_id, msg)
        if proc is None:
            return
        self.manager.write_input(proc, bytes(data), lambda err: self._answer(frame_id, err))

    def _answer(self, frame_id, err):
        if err is None:
            self._ok(frame_id)
        else:
            self._error(frame_id, err.code, err.message)

    def _close_stdin(self, frame_id, msg):
        proc = self._target(frame_id, msg)
        if proc is not None:
            self.manager.close_stdin(proc, lambda err: self._answer(frame_id, err))

    def _signal(self, frame_id, msg):
        signum = msg.get("signal")
        if not isinstance(signum, int) or isinstance(signum, bool) or signum not in SIGNALS:
            return self._error(frame_id, "invalid_argument", "unsupported signal %r" % (signum,))
        proc = self._target(frame_id, msg)
        if proc is not None:
            self.manager.signal(proc, signum)
            self._ok(frame_id)

    # ---- directory watches ----------------------------------------------------------------

    def _watch(self, sub_id, msg):
        if sub_id in self.subs:
            return self._error(sub_id, "bad_request", "stream %d is open" % sub_id)
        try:
            path = self._watch_path(msg)
            watch = DirWatch(path, msg.get("recursive") is True)
        except (WatchError, OpError) as e:
            return self._error(sub_id, e.code, e.message)
        sub = Sub(sub_id, watch=watch, entries=msg.get("entries") is True)
        self.subs[sub_id] = sub
        self._send_json(sub_id, {"op": "started", "path": path})
        self._arm_watch(sub)

    @staticmethod
    def _watch_path(msg):
        user = msg.get("user")
        if user is None:
            return check_path(msg.get("path"))
        try:
            home = guest_users.lookup(user).home
        except guest_users.UnknownUser:
            raise OpError("unknown_user", "invalid username: '%s'" % (user,)) from None
        try:
            return guest_users.resolve(msg.get("path"), home)
        except guest_users.BadPath as e:
            raise OpError("invalid_path", str(e)) from None

    def _arm_watch(self, sub):
        if sub.credit > 0 and len(self.out) - self.sent <= OUT_HIGH:
            self.loop.want(sub.watch.fd, EVENT_READ, lambda: self._on_watch(sub))
        else:
            self.loop.unwant(sub.watch.fd, EVENT_READ)

    def _on_watch(self, sub):
        if self.subs.get(sub.id) is not sub:
            return
        events = []
        for name, kind in sub.watch.read_events():
            event = {"name": name, "type": kind}
            if sub.entries and kind in ("create", "write", "chmod"):
                try:
                    event["entry"] = stat_detail(os.path.join(sub.watch.root, name))
                except OpError:
                    pass
            events.append(event)
        if events:
            sub.credit -= self._send_json(sub.id, {"op": "events", "events": events})
        self._arm_watch(sub)


def _named(msg):
    return ("with pid %s" % msg.get("pid")) if "pid" in msg else ("tagged %r" % msg.get("tag"))


class _NoCgroups:
    """No cgroups (tests on a host): every call does nothing."""

    def make(self, name):
        pass

    def joiner(self, name, die_with_agent=False):
        return None

    def kill(self, name):
        pass

    def remove(self, name):
        pass

    def sweep_prefix(self, prefix, keep):
        pass


def start(open_port, env, cgroups):
    """Serves the processes port from a thread of the agent (port_frames.serve_port)."""
    global _serving
    server = Server(env, cgroups)
    _serving = server
    return serve_port(open_port, PORT_NAME, server.serve, log, "processes are off")


def host_changed():
    """The agent greeted a new host connection: the port's streams are void (Server)."""
    if _serving is not None:
        _serving.host_changed()


def main(argv=None):
    parser = argparse.ArgumentParser(description="hostd processes server (tests)")
    parser.add_argument("--listen", required=True, metavar="SOCKET",
                        help="unix socket to accept hostd's connection on, as QEMU would")
    args = parser.parse_args(argv)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.listen)
    listener.listen(1)
    print(json.dumps({"listening": args.listen, "pid": os.getpid()}), flush=True)
    conn, _ = listener.accept()
    listener.close()
    with conn:
        env = _StaticEnv(dict(os.environ))
        Server(env, stop_at_eof=True).serve(conn.fileno())
    return 0


class _StaticEnv:
    def __init__(self, env):
        self.env = env

    def current(self):
        return self.env


if __name__ == "__main__":
    sys.exit(main())
