/**
 * A stand-in for libcapstone that hostd's QEMUs load instead of Debian's (docs/architecture.md, Density). QEMU links
 * capstone only to disassemble guest code for its debug log (`-d in_asm`) and the monitor's
 * `x/i`, and uses its own disassembler when capstone fails. Loading the real library cost every
 * QEMU 1.3 MiB: the dynamic linker relocates capstone's 1.3 MiB of pointer tables
 * (`.data.rel.ro`) in each process, where they become private copies no two QEMUs share. The
 * stand-in exports capstone 4's whole API with every call failing, so a QEMU linked against it
 * starts, whatever of the API it uses; QEMUs that link another capstone never look at it.
 *
 * It is compiled on this host with `cc` (a C library is what the dynamic linker loads) into the
 * cache, once per source, and given to QEMU through LD_LIBRARY_PATH.
 */
import { dirname } from 'node:path';
import { qemuLib } from './qemu-lib.js';

const SONAME = 'libcapstone.so.4';

/** capstone 4's exported functions (`nm -D libcapstone.so.4`), each returning a failure. */
const SOURCE = `/* hostd's stand-in for ${SONAME}: see src/vm/host/capstone-stand-in.ts. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef size_t csh;
enum { CS_ERR_ARCH = 2, CS_ERR_HANDLE = 3 };

unsigned int cs_version(int *major, int *minor) {
  if (major && minor) { *major = 4; *minor = 0; }
  return 4 << 8;
}
bool cs_support(int query) { (void)query; return false; }
int cs_open(int arch, int mode, csh *handle) { (void)arch; (void)mode; if (handle) *handle = 0; return CS_ERR_ARCH; }
int cs_close(csh *handle) { (void)handle; return CS_ERR_HANDLE; }
int cs_option(csh handle, int type, size_t value) { (void)handle; (void)type; (void)value; return CS_ERR_HANDLE; }
int cs_errno(csh handle) { (void)handle; return CS_ERR_HANDLE; }
const char *cs_strerror(int code) { (void)code; return "capstone is not loaded in hostd's QEMU"; }
size_t cs_disasm(csh handle, const uint8_t *code, size_t size, uint64_t address, size_t count, void **insn) {
  (void)handle; (void)code; (void)size; (void)address; (void)count; if (insn) *insn = NULL; return 0;
}
size_t cs_disasm_ex(csh handle, const uint8_t *code, size_t size, uint64_t address, size_t count, void **insn) {
  return cs_disasm(handle, code, size, address, count, insn);
}
void cs_free(void *insn, size_t count) { (void)insn; (void)count; }
void *cs_malloc(csh handle) { (void)handle; return NULL; }
bool cs_disasm_iter(csh handle, const uint8_t **code, size_t *size, uint64_t *address, void *insn) {
  (void)handle; (void)code; (void)size; (void)address; (void)insn; return false;
}
const char *cs_reg_name(csh handle, unsigned int id) { (void)handle; (void)id; return NULL; }
const char *cs_insn_name(csh handle, unsigned int id) { (void)handle; (void)id; return NULL; }
const char *cs_group_name(csh handle, unsigned int id) { (void)handle; (void)id; return NULL; }
bool cs_insn_group(csh handle, const void *insn, unsigned int id) { (void)handle; (void)insn; (void)id; return false; }
bool cs_reg_read(csh handle, const void *insn, unsigned int id) { (void)handle; (void)insn; (void)id; return false; }
bool cs_reg_write(csh handle, const void *insn, unsigned int id) { (void)handle; (void)insn; (void)id; return false; }
int cs_op_count(csh handle, const void *insn, unsigned int type) { (void)handle; (void)insn; (void)type; return -1; }
int cs_op_index(csh handle, const void *insn, unsigned int type, unsigned int position) {
  (void)handle; (void)insn; (void)type; (void)position; return -1;
}
int cs_regs_access(csh handle, const void *insn, uint16_t *read, uint8_t *read_count, uint16_t *write, uint8_t *write_count) {
  (void)handle; (void)insn; (void)read; (void)write;
  if (read_count) *read_count = 0;
  if (write_count) *write_count = 0;
  return CS_ERR_HANDLE;
}
`;

/** Freestanding: needs no C library headers (libc6-dev) and links nothing. */
const CC_FLAGS = [
  '-shared',
  '-fPIC',
  '-O2',
  '-ffreestanding',
  '-nostdlib',
  `-Wl,-soname,${SONAME}`,
];

/** The stand-in's directory for QEMU's LD_LIBRARY_PATH, or why there is none. */
export type StandIn = { dir: string } | { dir: null; why: string };

/**
 * The directory holding the stand-in, built into `cacheDir` if it is not there yet, and only
 * kept if `qemuBinary -version` starts with it.
 */
export function capstoneStandIn(cacheDir: string, qemuBinary: string, cc = 'cc'): StandIn {
  const built = qemuLib({
    cacheDir,
    qemuBinary,
    cc,
    file: SONAME,
    source: SOURCE,
    flags: CC_FLAGS,
    env: (lib) => ({ LD_LIBRARY_PATH: dirname(lib) }),
  });
  return built.path !== null ? { dir: dirname(built.path) } : { dir: null, why: built.why };
}
