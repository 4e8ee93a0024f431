"""Noticing that a process the agent started (bash, the REPL worker) has exited, from the
executor's selector loop, and its exit status in shell terms."""

import os
import threading


def exit_status(returncode):
    """Popen's returncode in shell convention: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def exit_notifier(proc):
    """An fd that becomes readable when proc exits: a pidfd, or a pipe closed by a waiter."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # Python < 3.9 or kernel < 5.3
        r, w = os.pipe()

        def wait():
            proc.wait()
            os.close(w)
        threading.Thread(target=wait, daemon=True).start()
        return r
