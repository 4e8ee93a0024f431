"""Variables that keep libraries on kernels the emulated CPU runs, and runs fast.

Under QEMU's TCG (hostd appends `tsc_early_khz=` to the kernel command line only then) the
guest's CPU reports an AMD vendor, family 15: OpenBLAS takes it for an Opteron. On the old
default model (qemu64) the Opteron kernels died of SIGILL in every matrix product, matplotlib
figure and scikit-learn fit: they use 3DNow! instructions that qemu64 does not advertise, and
TCG refuses what the model does not advertise. Prescott's kernels use SSE3 only.

On `max` (the default now: everything TCG emulates, 3DNow! included) the Opteron kernels run,
give the same results, and were the fastest measured for a 300x300 product under TCG: a median
0.70 of Prescott's time over six back-to-back runs on a loaded host (0.66 to 1.31), while
Haswell's took about twice Prescott's (AVX2 and FMA cost more emulated than they save) and
Zen's more (docs/architecture.md, "Compute under TCG"). They are named rather than left to
OpenBLAS's detection, so that another QEMU's `max` cannot move them.
Under KVM the guest sees the host's CPU and OpenBLAS chooses by itself.

glibc is kept off `rep stosb` / `rep movsb` (GLIBC_TUNABLES, ERMS and FSRM off) for the reason
the kernel is (hostd appends `clearcpuid=erms,rep_good` under TCG): QEMU 7.2's TCG runs a `rep`
string instruction one iteration per pass, so a 32 MiB `memset` took 121-148 ms in a guest with
them and 17-22 ms without (docs/architecture.md, "Compute under TCG"). Under KVM they are the
fast ones and nothing is set.
"""

TCG_MARK = "tsc_early_khz="
# What OpenBLAS's Opteron_SSE3 kernels need beyond SSE2: SSE3, and 3DNow! (with AMD's MMX
# extensions) for their prefetches.
OPTERON_FLAGS = ("pni", "3dnow", "mmxext")  # SSE3 is "pni" in /proc/cpuinfo
# glibc's string functions without the `rep` variants: its SSE2/AVX loops, which TCG runs well.
GLIBC_NO_REP_STRINGS = "glibc.cpu.hwcaps=-ERMS,-FSRM"


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_flags(cpuinfo):
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def emulation_env(cmdline_path="/proc/cmdline", cpuinfo_path="/proc/cpuinfo"):
    """The variables to add to the default environment on this machine ({} under KVM)."""
    cmdline = _read(cmdline_path)
    if cmdline is None or TCG_MARK not in cmdline:
        return {}
    flags = _cpu_flags(_read(cpuinfo_path) or "")
    coretype = "Opteron_SSE3" if set(OPTERON_FLAGS) <= flags else "Prescott"
    return {"OPENBLAS_CORETYPE": coretype, "GLIBC_TUNABLES": GLIBC_NO_REP_STRINGS}
