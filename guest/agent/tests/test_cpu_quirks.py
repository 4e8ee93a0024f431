"""Which OpenBLAS kernels an emulated CPU gets (cpu_quirks.py)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cpu_quirks import GLIBC_NO_REP_STRINGS, emulation_env  # noqa: E402

TCG = "console=ttyS0 quiet tsc_early_khz=2100000\n"
# /proc/cpuinfo's flags in a guest on `-cpu max` (QEMU 7.2, read in a sandbox), and qemu64's
# (abridged: no 3DNow!, nothing past SSE3).
MAX = ("fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush acpi mmx fxsr "
       "sse sse2 ss syscall nx mmxext pdpe1gb rdtscp lm 3dnowext 3dnow rep_good nopl cpuid "
       "extd_apicid pni pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx "
       "f16c rdrand hypervisor lahf_lm svm cr8_legacy abm sse4a 3dnowprefetch vmmcall fsgsbase "
       "bmi1 avx2 smep bmi2 erms mpx adx smap clflushopt clwb xsaveopt xgetbv1 arat npt vgif umip "
       "pku ospke vaes")
QEMU64 = ("fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
          "fxsr sse sse2 syscall nx lm rep_good nopl cpuid pni cx16 hypervisor lahf_lm svm "
          "rdrand arat")


class EmulationEnvironment(unittest.TestCase):
    def file(self, text):
        f = tempfile.NamedTemporaryFile("w", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(text)
        f.close()
        return f.name

    def env(self, cmdline, flags):
        return emulation_env(self.file(cmdline),
                             self.file("processor\t: 0\nflags\t\t: %s\n" % flags))

    def test_on_max_openblas_gets_the_opteron_kernels_it_runs_fastest(self):
        self.assertEqual(self.env(TCG, MAX)["OPENBLAS_CORETYPE"], "Opteron_SSE3")

    def test_on_qemu64_without_3dnow_openblas_is_kept_to_sse3_kernels(self):
        self.assertEqual(self.env(TCG, QEMU64)["OPENBLAS_CORETYPE"], "Prescott")

    def test_an_unreadable_cpuinfo_under_tcg_means_the_safe_kernels(self):
        self.assertEqual(emulation_env(self.file(TCG), "/nonexistent/cpuinfo")["OPENBLAS_CORETYPE"],
                         "Prescott")

    def test_under_tcg_glibc_keeps_off_the_rep_string_instructions_tcg_runs_a_byte_a_pass(self):
        self.assertEqual(self.env(TCG, MAX)["GLIBC_TUNABLES"], GLIBC_NO_REP_STRINGS)
        self.assertEqual(self.env(TCG, QEMU64)["GLIBC_TUNABLES"], GLIBC_NO_REP_STRINGS)

    def test_under_kvm_nothing_is_added(self):
        self.assertEqual(self.env("console=ttyS0 quiet\n", MAX), {})

    def test_an_unreadable_command_line_adds_nothing(self):
        self.assertEqual(emulation_env("/nonexistent/cmdline"), {})


if __name__ == "__main__":
    unittest.main()
