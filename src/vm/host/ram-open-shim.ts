/**
 * Keeps RAM images read-only to the QEMUs that map them (docs/operations.md, Security). A VM
 * restored from a template or a fork point maps that image copy-on-write (`share=off`): its
 * writes go to its own pages, and the file is shared by every VM restored from it. QEMU 7.2
 * (Debian bookworm's) still opens a `memory-backend-file` read-write, so the image had to be
 * writable by QEMU's group, and a QEMU a guest took over could write into it, changing the
 * pages its template's or fork point's other VMs had not written yet. QEMU 8.2's
 * `readonly=on,rom=off` is the upstream fix.
 *
 * This library, loaded into each QEMU with LD_PRELOAD, retries a read-write open of a RAM image
 * (`*.mem`, `memory.img`, also as a jailed QEMU's view names them: vm/host/vm-view.ts) that the kernel refused with EACCES as read-only. A private mapping
 * needs no more, and the images are then root's and `0640` (vm/storage/mem-image.ts): the
 * boundary is the file's mode, which the QEMU cannot change, not this library, which a QEMU a
 * guest took over can ignore. An open that succeeds (the template boot's own RAM file, which it
 * writes) is untouched, so the library changes only what would otherwise fail.
 */
import { qemuLib, type QemuLib } from './qemu-lib.js';

const FILE = 'hostd-ram-open.so';

/**
 * Freestanding (gcc's own headers, no libc6-dev): the few libc declarations it needs are
 * written out; symbols resolve against the libc QEMU loads. QEMU 7.2 calls `open64` and, when
 * fortified, `__open64_2`.
 */
const SOURCE = `/* hostd's RAM image open shim: see src/vm/host/ram-open-shim.ts. */
#include <stdarg.h>
#include <stddef.h>

#define RTLD_NEXT ((void *)-1l)
#define O_ACCMODE 03
#define O_RDONLY 00
#define O_RDWR 02
#define O_CREAT 0100
#define O_TMPFILE 020200000
#define EACCES 13

extern void *dlsym(void *handle, const char *symbol);
extern int *__errno_location(void);

typedef int (*open_fn)(const char *, int, ...);

static size_t length(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

static int ends_with(const char *s, size_t n, const char *tail) {
  size_t t = length(tail);
  if (n < t) return 0;
  for (size_t i = 0; i < t; i++) if (s[n - t + i] != tail[i]) return 0;
  return 1;
}

static int ram_image(const char *path) {
  if (!path) return 0;
  size_t n = length(path);
  return ends_with(path, n, ".mem") || ends_with(path, n, "memory.img");
}

int open64(const char *path, int flags, ...) {
  static open_fn real;
  if (!real) real = (open_fn)dlsym(RTLD_NEXT, "open64");
  unsigned int mode = 0;
  if (flags & O_CREAT || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, unsigned int);
    va_end(ap);
  }
  int fd = real(path, flags, mode);
  if (fd < 0 && *__errno_location() == EACCES && (flags & O_ACCMODE) == O_RDWR &&
      !(flags & O_CREAT) && ram_image(path)) {
    fd = real(path, (flags & ~O_ACCMODE) | O_RDONLY, mode);
  }
  return fd;
}

int __open64_2(const char *path, int flags) { return open64(path, flags); }
`;

const CC_FLAGS = ['-shared', '-fPIC', '-O2', '-ffreestanding', '-nostdlib'];

/** The shim's path for QEMU's LD_PRELOAD, built into `cacheDir` if it is not there yet. */
export function ramOpenShim(cacheDir: string, qemuBinary: string, cc = 'cc'): QemuLib {
  return qemuLib({
    cacheDir,
    qemuBinary,
    cc,
    file: FILE,
    source: SOURCE,
    flags: CC_FLAGS,
    env: (lib) => ({ LD_PRELOAD: lib }),
  });
}
