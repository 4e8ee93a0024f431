"""What the agent does to the guest kernel: set the clock and reseed the RNG after every restore
(clones must share neither a stale clock nor secrets), and zero free memory before a template
is frozen."""

import fcntl
import os
import struct
import time

RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207      # _IO('R', 0x07)
ZERO_MARGIN = 64 << 20      # free memory left unwritten by the zero fill
ZERO_CHUNK = 1 << 20


def set_clock(time_ns, log):
    # hostd sends time_ns as a decimal string (a JS BigInt); PROTOCOL.md says int
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, int(time_ns))
    except (TypeError, ValueError, OSError) as e:
        log("cannot set the clock:", e)


_urandom_fd = None


def reseed_kernel(seed, log):
    global _urandom_fd
    try:
        raw = bytes.fromhex(seed)
        # Opened once, before the template is frozen, so a restore does not walk the path
        # again (first runs of kernel code are what a restore pays for under TCG).
        if _urandom_fd is None:
            _urandom_fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
        fcntl.ioctl(_urandom_fd, RNDADDENTROPY, struct.pack("ii", len(raw) * 8, len(raw)) + raw)
        fcntl.ioctl(_urandom_fd, RNDRESEEDCRNG)
    except (TypeError, ValueError, OSError) as e:
        log("cannot reseed the kernel RNG:", e)


def free_memory():
    """MemFree of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemFree:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemFree in /proc/meminfo")


def zero_free_memory(free=free_memory, margin=ZERO_MARGIN):
    """Overwrites free guest memory with zeros; returns how many bytes it wrote.

    Pages the kernel freed still hold their old bytes (the unpacked initrd, the imports of the
    preload); zero pages become holes in the frozen template image, which forks never copy.
    Zeros go into a memfd (an unnamed tmpfs file: no mount, no path) until only `margin` is
    free, and the pages, zero now, are freed again with it.
    """
    fd = os.memfd_create("hostd-zero", os.MFD_CLOEXEC)
    try:
        return fill_with_zeros(fd, free, margin)
    finally:
        os.close(fd)


def fill_with_zeros(fd, free, margin, chunk=ZERO_CHUNK):
    """Writes zeros to fd until free() is within one chunk of margin. free() is asked again
    after each round: writing may make the kernel reclaim caches, which frees more. Stops
    early, keeping what it wrote, if memory runs out first (ENOSPC, ENOMEM)."""
    zeros = bytes(chunk)
    written = 0
    for _ in range(8):                   # rounds; each reclaims less than the one before
        todo = (free() - margin) // chunk
        if todo <= 0:
            break
        try:
            for _ in range(todo):
                written += os.write(fd, zeros)
        except OSError:
            break
    return written
