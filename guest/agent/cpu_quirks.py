"""Variables that keep libraries off instructions the emulated CPU lacks.

Under QEMU's TCG (hostd appends `tsc_early_khz=` to the kernel command line only then) the
guest's CPU is qemu64, whose vendor is AMD: OpenBLAS takes it for an Opteron and picks kernels
with instructions TCG does not emulate, so every matrix product (numpy's `@`, a matplotlib
figure, scikit-learn) died of SIGILL. Prescott's kernels use SSE3 only, which TCG has. Under
KVM the guest sees the host's CPU and OpenBLAS chooses by itself.
"""

TCG_MARK = "tsc_early_khz="


def emulation_env(cmdline_path="/proc/cmdline"):
    """The variables to add to the default environment on this machine ({} under KVM)."""
    try:
        with open(cmdline_path) as f:
            cmdline = f.read()
    except OSError:
        return {}
    if TCG_MARK not in cmdline:
        return {}
    return {"OPENBLAS_CORETYPE": "Prescott"}
