"""What the agent does to the guest kernel: set the clock and reseed the RNG after every restore
(clones must share neither a stale clock nor secrets), zero free memory before a template is
frozen, and drop the cache of written files before a pause."""

import fcntl
import os
import stat
import struct
import time

RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207      # _IO('R', 0x07)
ZERO_MARGIN = 64 << 20      # free memory left unwritten by the zero fill
ZERO_CHUNK = 1 << 20
UPPER_FD = 9                # the writable layer's upper directory, opened by guest/image/init
RELEASE_MIN_BYTES = 64 << 10  # smaller files hold little cache; a pip install makes thousands
RELEASE_BUDGET_S = 2.0      # at most this long walking the layer, so a pause is never held up


def set_clock(time_ns, log):
    # hostd sends time_ns as a decimal string (a JS BigInt); PROTOCOL.md says int
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, int(time_ns))
    except (TypeError, ValueError, OSError) as e:
        log("cannot set the clock:", e)


_urandom_fd = None


def reseed_kernel(seed, log):
    """seed: hex (the hello's `seed`)."""
    try:
        raw = bytes.fromhex(seed)
    except (TypeError, ValueError) as e:
        return log("cannot reseed the kernel RNG:", e)
    reseed_kernel_raw(raw, log)


_SEED32_HEADER = struct.pack("ii", 32 * 8, 32)   # hostd's seeds: 32 bytes, 256 bits


def reseed_kernel_raw(raw, log):
    """Mixes raw (bytes) into the kernel RNG and forces a reseed."""
    global _urandom_fd
    try:
        # Opened once, before the template is frozen, so a restore does not walk the path
        # again (first runs of kernel code are what a restore pays for under TCG).
        if _urandom_fd is None:
            _urandom_fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
        header = (_SEED32_HEADER if len(raw) == 32
                  else struct.pack("ii", len(raw) * 8, len(raw)))
        fcntl.ioctl(_urandom_fd, RNDADDENTROPY, header + raw)
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


def claim_upper_dir(fd=UPPER_FD):
    """The writable layer's directory fd that init left open, kept from the processes the agent
    starts (it is the agent's, not user code's); None when there is none (no disk, or tests)."""
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            return None
        os.set_inheritable(fd, False)
        return fd
    except OSError:
        return None


def release_written_files(upper_fd, budget_s=RELEASE_BUDGET_S, clock=time.monotonic):
    """Writes back, then drops from the guest's page cache, every file of the writable layer
    (the files this sandbox wrote or changed); returns how many files it dropped.

    A pause saves the guest RAM pages written since the restore, and the cache of a freshly
    written file is such pages: 100 MiB written cost a paused sandbox 100 MiB more to save and
    to load back on resume, though the same bytes are on its disk already. Dropped pages are
    zeroed by the kernel (init_on_free), and zero pages are not saved. Only files of the
    writable layer: the template's own files were cached before the freeze, in pages every
    sandbox shares, and dropping those would make them written (zeroed) pages instead.
    Mapped and dirty pages stay (the kernel keeps them); stops after `budget_s`.
    """
    os.sync()  # one journal commit for all, rather than an fdatasync per file
    deadline = clock() + budget_s
    released = 0
    for _, _, names, dir_fd in os.fwalk(".", dir_fd=upper_fd):
        for name in names:
            if clock() > deadline:
                return released
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_size < RELEASE_MIN_BYTES:
                    continue
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:
                continue   # gone meanwhile, or not ours to open: its cache stays, that is all
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                released += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return released
