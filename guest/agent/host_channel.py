"""The agent's side of its port to hostd (`hostd.agent`): opening the virtio-serial ports, and
writing to the host without ever making a reply wait behind backpressured output."""

import collections
import errno
import glob
import os
import threading
import time

from hostd_wire import encode, write_all


class Channel:
    """The write side of the host channel. Output is written synchronously by the executor
    (that is the backpressure point); control replies go through a small writer thread."""

    def __init__(self, wfd, log):
        self.wfd, self.log = wfd, log
        self._wlock = threading.Lock()
        self._control = collections.deque()
        self._cond = threading.Condition()
        self._failed = False
        threading.Thread(target=self._control_writer, name="control", daemon=True).start()

    def write(self, chunks):
        data = b"".join(chunks)
        with self._wlock:
            try:
                write_all(self.wfd, data)
            except OSError as e:
                if not self._failed:     # host gone or port unplugged: say it once
                    self.log("channel write failed:", e)
                self._failed = True

    def send_control(self, msg):
        with self._cond:
            if len(self._control) < 10000:   # a host that floods requests and never reads
                self._control.append(encode(msg))  # loses replies, not our memory
                self._cond.notify()

    def _control_writer(self):
        while True:
            with self._cond:
                while not self._control:
                    self._cond.wait()
                batch = list(self._control)
                self._control.clear()
            self.write(batch)


def open_port(name, timeout=5.0):
    """Open the virtio-serial port called `name`. The device may show up late after boot."""
    deadline = time.monotonic() + timeout
    while True:
        dev = None
        for path in glob.glob("/sys/class/virtio-ports/*/name"):
            try:
                with open(path) as f:
                    if f.read().strip() == name:
                        dev = "/dev/" + os.path.basename(os.path.dirname(path))
            except OSError:
                pass
        try:
            if dev is None:
                raise FileNotFoundError("no virtio port named %s" % name)
            return os.open(dev, os.O_RDWR)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENXIO):
                raise                    # only these mean "not there yet"
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.05)
