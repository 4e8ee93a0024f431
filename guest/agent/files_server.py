#!/usr/bin/env python3
"""hostd guest files server: serves the `hostd.files` port (guest/PROTOCOL.md, "Files port").

Runs in its own thread of the agent process (start()), so a file can be read or written while
an exec runs, and without a second process: under TCG every switch between guest processes
costs a flush of QEMU's soft TLB. One operation at a time, as hostd sends them: a request
(JSON frame), for uploads the data frames and an end frame, then one `done` frame back (a
download sends a `head` and its data frames before it). A small operation is one write each
way. hostd can cancel an operation at any point, or start over with a hello (after a restore,
or when it reconnected): the operation stops where it is and leaves nothing behind.

Standalone, for tests:  files_server.py --listen SOCKET  (serves each connection in turn).
"""

import argparse
import collections
import json
import os
import select
import socket
import sys
import threading
import time
import traceback

import files_ops
import files_tar
import files_user
from files_ops import OpError, check_path
from port_frames import (DATA, END, HEADER, JSON, SYNC_EVENT, SYNC_REPLY, EofBackoff, FrameReader,
                         frame, serve_port)

PORT_NAME = "hostd.files"
VERSION = 1
CHUNK = 64 << 10            # payload of the data frames this end sends
FLUSH_AT = 256 << 10        # output goes out when this much waits, or when an operation ends
LOOK_EVERY = 0.05           # while an operation sends, how often it looks for a cancel at least
MAX_REPLY = 16 << 20        # a listing larger than this is refused


def log(*args):
    print("hostd-files:", *args, file=sys.stderr, flush=True)


class Abort(Exception):
    """The running operation must stop where it is: hostd cancelled it ("cancel"), started over
    with a hello ("sync"), or went away ("eof")."""

    def __init__(self, why):
        super().__init__(why)
        self.why = why


def encode_json(obj):
    # backslashreplace: a file name that is not UTF-8 still makes valid JSON
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "backslashreplace")


class Link:
    """The port, as the operations see it: blocking calls that keep reading what hostd sends,
    so that a cancel or a hello always gets through, even while hostd reads nothing."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd
        for fd in {rfd, wfd}:
            os.set_blocking(fd, False)
        self.reader = FrameReader((JSON, DATA, END))
        self.pending = collections.deque()   # events read while writing, for the main loop
        self.out = bytearray()               # frames to write, from offset `sent`
        self.sent = 0
        self.op_id = None                    # the operation running, if any
        self.reads = 0                       # successful reads so far
        self.look_at = 0.0                   # when send() looks for a cancel next

    def _read(self):
        """One read into the frame reader; False when there was nothing to read."""
        try:
            n = self.reader.read_from(self.rfd)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            log("port read failed:", e)
            n = 0
        if n == 0:
            # The host end is closed (a virtio port reads EOF until hostd reconnects): what it
            # sent half of will never be finished, and it starts again with a hello.
            self.reader.reset()
            self.pending.clear()
            raise Abort("eof")
        self.reads += 1
        return True

    def _wait(self, events):
        poller = select.poll()
        if self.rfd == self.wfd:
            poller.register(self.rfd, events)
        else:
            poller.register(self.rfd, events & select.POLLIN)
            if events & select.POLLOUT:
                poller.register(self.wfd, select.POLLOUT)
        return {fd: ev for fd, ev in poller.poll()}

    def event(self):
        """The next event from hostd (SYNC_EVENT or a frame), waiting for it."""
        if self.pending:
            return self.pending.popleft()
        while True:
            ev = self.reader.next()
            if ev is not None:
                return ev
            if not self._read():
                self._wait(select.POLLIN)

    def recv_data(self):
        """The next piece of the running operation's upload; None at its end."""
        while True:
            ev = self.event()
            if ev is SYNC_EVENT:
                raise Abort("sync")
            kind, frame_id, payload = ev
            if frame_id != self.op_id:
                continue                     # left over from an operation that ended early
            if kind == DATA:
                return payload
            if kind == END:
                return None
            self._control(payload)

    def _control(self, payload):
        try:
            msg = json.loads(payload)
        except ValueError:
            return
        if isinstance(msg, dict) and msg.get("op") == "cancel":
            raise Abort("cancel")
        log("ignored during an operation: %r" % (payload[:200],))

    def send(self, kind, frame_id, payload=b""):
        self.out += HEADER.pack(kind, frame_id, len(payload))
        self.out += payload
        if len(self.out) - self.sent >= FLUSH_AT:
            self.flush()
        elif self.op_id is not None and time.monotonic() >= self.look_at:
            self.look()

    def look(self):
        """Reads what hostd sent, without waiting: a cancel of the running operation or a hello
        stops it here (Abort). A host that reads everything never makes a write block, so
        waiting for that to look (as flush() does) would let a download nobody wants stream
        on to its end: a terabyte, or /proc/kcore's 128 TiB. One read that finds nothing
        costs a system call per LOOK_EVERY or per FLUSH_AT bytes sent."""
        self.look_at = time.monotonic() + LOOK_EVERY
        try:
            self._interrupts()
        except Abort as e:
            if e.why != "cancel" or self.sent == 0:
                self.discard()               # nothing of it went out: hostd wants none of it
            raise

    def discard(self):
        """Drops what waits (after a hello: hostd discards everything before its answer)."""
        del self.out[:]
        self.sent = 0

    def flush(self):
        """Writes what waits. While hostd does not read, watches what it sends: a cancel of the
        running operation or a hello stops it (a hello also drops what waits).

        Written from an offset, the buffer emptied only once all of it is out: deleting what
        each partial write took from the front made every later append move the rest."""
        out = self.out
        if self.op_id is not None:
            self.look()
        try:
            while self.sent < len(out):
                try:
                    with memoryview(out) as view:
                        self.sent += os.write(self.wfd, view[self.sent:])
                    continue
                except (BlockingIOError, InterruptedError):
                    pass
                if any(ev & (select.POLLIN | select.POLLHUP | select.POLLERR)
                       for ev in self._wait(select.POLLIN | select.POLLOUT).values()):
                    self._interrupts()
        except Abort as e:
            if e.why != "cancel":
                self.discard()
            raise
        self.discard()

    def _interrupts(self):
        """Handles what hostd sent while this end writes: what the reader holds already (the
        read that brought the request may have brought its cancel too), then what the port
        has, until it has nothing."""
        while True:
            while True:
                ev = self.reader.next()
                if ev is None:
                    break
                if ev is SYNC_EVENT:
                    self.pending.clear()
                    raise Abort("sync")
                kind, frame_id, payload = ev
                if kind != JSON:
                    continue                 # no upload runs while this end writes
                if frame_id == self.op_id and self.op_id is not None:
                    self._control(payload)
                else:
                    self.pending.append(ev)
            if not self._read():
                return


class UploadReader:
    """The running operation's upload as a binary file object (for tarfile's stream mode)."""

    def __init__(self, link):
        self.link = link
        self.chunk, self.pos, self.eof = b"", 0, False

    def read(self, n=-1):
        while self.pos >= len(self.chunk):
            if self.eof:
                return b""
            data = self.link.recv_data()
            if data is None:
                self.eof = True
                return b""
            self.chunk, self.pos = data, 0
        end = len(self.chunk) if n is None or n < 0 else self.pos + n
        piece = self.chunk[self.pos:end]
        self.pos += len(piece)
        return piece

    def drain(self):
        """Reads up to the end of the upload (what follows the tar's end-of-archive blocks)."""
        while self.read(CHUNK):
            pass


class DownloadWriter:
    """Data frames of the running operation as a binary file object (for tarfile)."""

    def __init__(self, link, frame_id):
        self.link, self.frame_id = link, frame_id

    def write(self, data):
        view = memoryview(data)
        for start in range(0, len(view), CHUNK):
            self.link.send(DATA, self.frame_id, view[start:start + CHUNK])
        return len(data)


# ---- operations: each returns the fields of its `done`, or raises OpError ----------------

def op_write(link, frame_id, msg):
    path = check_path(msg.get("path"))
    mode = msg.get("mode", 0o644)
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise OpError("bad_request", "mode must be an int within 0..0o7777")
    if path == "/":
        raise OpError("is_a_directory", "/ is a directory")
    with files_ops.AtomicFile(path, mode) as f:
        while True:
            data = link.recv_data()
            if data is None:
                break
            f.write(data)
        f.commit()
    return {"path": path, "size": f.size}


def op_read(link, frame_id, msg):
    path = check_path(msg.get("path"))
    fd, size, content = files_ops.open_for_read(path)
    try:
        link.send(JSON, frame_id, encode_json({"op": "head", "size": size}))
        if content is not None:
            if content:
                DownloadWriter(link, frame_id).write(content)
            return {}
        left = size
        while left:
            try:
                data = os.read(fd, min(CHUNK, left))
            except OSError as e:
                raise files_ops.os_error(e, path)
            if not data:
                raise OpError("io_error", "%s shrank while it was read" % path)
            link.send(DATA, frame_id, data)
            left -= len(data)
        return {}
    finally:
        os.close(fd)


def op_list(link, frame_id, msg):
    return {"entries": files_ops.list_dir(check_path(msg.get("path")))}


def op_stat(link, frame_id, msg):
    return {"entry": files_ops.stat_path(check_path(msg.get("path")))}


def op_mkdir(link, frame_id, msg):
    path = check_path(msg.get("path"))
    files_ops.mkdir(path)
    return {"path": path}


def op_remove(link, frame_id, msg):
    files_ops.remove(check_path(msg.get("path")), msg.get("recursive") is True)
    return {}


def op_tar_out(link, frame_id, msg):
    path = check_path(msg.get("path"))
    try:
        os.stat(path)                # errors before the head: hostd can still answer 404
    except OSError as e:
        raise files_ops.os_error(e, path)
    link.send(JSON, frame_id, encode_json({"op": "head"}))
    files_tar.write_tar(path, DownloadWriter(link, frame_id))
    return {}


def op_tar_in(link, frame_id, msg):
    path = check_path(msg.get("path"))
    src = UploadReader(link)
    files, size = files_tar.extract_tar(path, src)
    src.drain()
    return {"path": path, "files": files, "size": size}


OPERATIONS = {"write": op_write, "read": op_read, "list": op_list, "stat": op_stat,
              "mkdir": op_mkdir, "remove": op_remove, "tar_out": op_tar_out,
              "tar_in": op_tar_in, "move": files_user.op_move}


def operation(msg):
    """The function serving request `msg`, or None: a request naming a `user` gets the
    operations as a user (files_user.py); those it has no own version of (read, tar_out,
    tar_in) run as the plain ones on the path resolved for the user."""
    op = msg.get("op")
    if msg.get("user") is None or op not in OPERATIONS:
        return OPERATIONS.get(op)
    as_user = files_user.USER_OPERATIONS.get(op)
    if as_user is not None:
        return as_user
    plain = OPERATIONS[op]

    def resolved(link, frame_id, request):
        return plain(link, frame_id, dict(request, path=files_user.resolve_read(request)))
    return resolved


class Server:
    def __init__(self, rfd, wfd, stop_at_eof=False):
        self.link = Link(rfd, wfd)
        self.stop_at_eof = stop_at_eof

    def serve(self):
        """Serves until EOF with stop_at_eof; forever otherwise (hostd may reconnect)."""
        backoff = EofBackoff()
        while True:
            reads = self.link.reads
            try:
                self._serve()
            except Abort:                    # EOF while idle
                if self.stop_at_eof:
                    return
                if self.link.reads != reads:
                    backoff.reset()          # hostd was there in between
                time.sleep(backoff.next())   # the port reads EOF until hostd reconnects

    def _serve(self):
        link = self.link
        while True:
            ev = link.event()
            if ev is SYNC_EVENT:
                continue                     # nothing runs: nothing to stop
            kind, frame_id, payload = ev
            if kind != JSON:
                continue                     # left over from an operation that ended early
            try:
                msg = json.loads(payload)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):
                log("malformed request dropped: %r" % (payload[:200],))
                continue
            op = msg.get("op")
            try:
                if op == "hello":
                    self._hello(msg)
                elif op in OPERATIONS:
                    self._run(frame_id, operation(msg), msg)
                elif op != "cancel":         # a cancel of an operation already over: nothing
                    self._reply(frame_id, {"op": "done", "ok": False, "code": "bad_request",
                                           "message": "unknown op %r" % (op,)})
            except Abort as e:
                if e.why == "eof":
                    raise
                # "sync": hostd started over; its hello is the next event

    def _hello(self, msg):
        self.link.discard()                  # anything older is discarded by hostd anyway
        self.link.out += SYNC_REPLY
        self.link.out += frame(JSON, 0, encode_json({
            "op": "hello", "nonce": msg.get("nonce"), "version": VERSION, "pid": os.getpid()}))
        self._flush()

    def _run(self, frame_id, operation, msg):
        link = self.link
        link.op_id = frame_id
        try:
            reply = {"op": "done", "ok": True}
            reply.update(operation(link, frame_id, msg))
        except OpError as e:
            reply = {"op": "done", "ok": False}
            reply.update(e.fields())
        except Abort as e:
            if e.why != "cancel":
                raise                        # the host that asked is gone: nobody to answer
            reply = {"op": "done", "ok": False, "code": "cancelled",
                     "message": "cancelled by hostd"}
        except Exception as e:
            log("internal error:\n" + traceback.format_exc())
            reply = {"op": "done", "ok": False, "code": "io_error",
                     "message": "internal error: %s" % e}
        finally:
            link.op_id = None
        self._reply(frame_id, reply)

    def _reply(self, frame_id, reply):
        payload = encode_json(reply)
        if len(payload) > MAX_REPLY:
            payload = encode_json({"op": "done", "ok": False, "code": "unsupported_file",
                                   "reason": "answer_too_large",
                                   "message": "the answer is too large (%d bytes)" % len(payload)})
        self.link.send(JSON, frame_id, payload)
        self._flush()

    def _flush(self):
        try:
            self.link.flush()
        except Abort as e:
            if e.why == "sync":
                raise
            # "cancel" cannot come (no operation runs); "eof": the next read says it again


REHEARSAL_FILE = "/tmp/.hostd-files-rehearsal"
REHEARSAL_ROUNDS = 10
REHEARSAL_TIMEOUT = 10.0       # seconds; a template boot under TCG is slow
# Made by the first rehearsal of a boot, on /run (a tmpfs sandbox-init mounts): a template's is
# in the memory every sandbox restored from it starts with.
REHEARSED_MARK = "/run/hostd-files-rehearsed"


def rehearse(rounds=REHEARSAL_ROUNDS):
    """Serves, on a socket pair, what a sandbox's first file operations are: small uploads (a new
    file, then replacements), downloads and stats of a hidden file in /tmp, a listing of /tmp and
    the file's removal, each checked to be answered ok; the file is removed whatever happened.

    Run once at the agent's start (start()), so in a template before it is frozen: every sandbox
    restored from it inherits what its first operations would otherwise each do again in the
    guest (the mount table read, the refused O_TMPFILE, the Python code of this path quickened
    and specialised, the kernel's caches), so a new sandbox's first PUTs and GETs run less code
    that its QEMU must translate first (docs/architecture.md, "Where a small file operation
    ..."). Costs the template's boot some milliseconds and no sandbox any memory of its own (the
    pages are the template's, shared). Best effort: a failure is logged and changes nothing."""
    try:
        files_ops.prime()
        host, guest = socket.socketpair()
    except Exception as e:                   # never keeps the agent from starting
        log("rehearsal not run: %s" % e)
        return
    server = threading.Thread(target=Server(guest.fileno(), guest.fileno(),
                                            stop_at_eof=True).serve, daemon=True)
    deadline = time.monotonic() + REHEARSAL_TIMEOUT
    content = b"." * 4096
    ops = []
    for _ in range(rounds):
        ops += [({"op": "write", "path": REHEARSAL_FILE, "mode": 0o600}, content),
                ({"op": "read", "path": REHEARSAL_FILE}, None),
                ({"op": "stat", "path": REHEARSAL_FILE}, None)]
    ops += [({"op": "list", "path": "/tmp"}, None),
            ({"op": "remove", "path": REHEARSAL_FILE}, None)]
    try:
        server.start()
        answers = FrameReader((JSON, DATA, END))
        # One at a time, as hostd sends them: the server drops an upload's data that comes
        # while it still sends the previous answer.
        for frame_id, (request, upload) in enumerate(ops, 1):
            out = frame(JSON, frame_id, encode_json(request))
            if upload is not None:
                out += frame(DATA, frame_id, upload) + frame(END, frame_id)
            host.sendall(out)
            done = None
            while done is None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([host], [], [], left)[0]:
                    raise OSError("no answer within %.0f s" % REHEARSAL_TIMEOUT)
                piece = host.recv(1 << 20)
                if not piece:
                    raise OSError("the server closed the pair")
                answers.feed(piece)
                done = _done(answers)
            if not done.get("ok"):
                log("rehearsal: %s failed: %r" % (request["op"], done))
                break
    except Exception as e:                   # never keeps the agent from starting
        log("rehearsal failed: %s" % e)
    finally:
        host.close()                         # EOF: the server returns
        if server.ident is not None:
            server.join(REHEARSAL_TIMEOUT)
        if not server.is_alive():            # else its fd must not be reused under it
            guest.close()
        try:
            os.unlink(REHEARSAL_FILE)        # removed already, unless something failed
        except OSError:
            pass


def _done(answers):
    """The first `done` answer among the frames `answers` (a FrameReader) holds whole, else
    None; the frames before it (a download's data) are dropped."""
    event = answers.next()
    while event is not None:
        if event is not SYNC_EVENT and event[0] == JSON:
            msg = json.loads(event[2])
            if msg.get("op") == "done":
                return msg
        event = answers.next()
    return None


def rehearse_once():
    """rehearse(), at the first start of the agent in this boot only: a template's. sandbox-init
    starts the agent again when it exits (an OOM kill in a running sandbox), and there the
    rehearsal would only delay the sandbox's recovery, replace a file of the user's at
    REHEARSAL_FILE and list the user's /tmp. No mark can be made (no /run): rehearsed, as
    before the mark."""
    try:
        os.close(os.open(REHEARSED_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600))
    except FileExistsError:
        return
    except OSError as e:
        log("rehearsal mark not made: %s" % e)
    rehearse()


def start(open_port):
    """Serves the files port from a thread of the agent (port_frames.serve_port), after a
    rehearsal (rehearse_once()): here, before the agent answers hostd's hello, so in a template
    that is done before it is frozen."""
    rehearse_once()
    return serve_port(open_port, PORT_NAME, lambda fd: Server(fd, fd).serve(), log,
                      "file transfer is off")


def main(argv=None):
    parser = argparse.ArgumentParser(description="hostd files server (tests)")
    parser.add_argument("--listen", required=True, metavar="SOCKET",
                        help="unix socket to accept hostd's connections on, as QEMU would")
    args = parser.parse_args(argv)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.listen)
    server.listen(1)
    print(json.dumps({"listening": args.listen, "pid": os.getpid()}), flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            Server(conn.fileno(), conn.fileno(), stop_at_eof=True).serve()


if __name__ == "__main__":
    sys.exit(main())
