"""Which variables keep libraries off instructions an emulated CPU lacks (cpu_quirks.py)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cpu_quirks import emulation_env  # noqa: E402


class EmulationEnvironment(unittest.TestCase):
    def cmdline(self, text):
        f = tempfile.NamedTemporaryFile("w", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(text)
        f.close()
        return f.name

    def test_under_tcg_openblas_is_kept_to_sse3_kernels(self):
        path = self.cmdline("console=ttyS0 quiet tsc_early_khz=2100000\n")
        self.assertEqual(emulation_env(path), {"OPENBLAS_CORETYPE": "Prescott"})

    def test_under_kvm_nothing_is_added(self):
        self.assertEqual(emulation_env(self.cmdline("console=ttyS0 quiet\n")), {})

    def test_an_unreadable_command_line_adds_nothing(self):
        self.assertEqual(emulation_env("/nonexistent/cmdline"), {})


if __name__ == "__main__":
    unittest.main()
