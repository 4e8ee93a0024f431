"""The README's examples are programs: every ``python`` block runs in a fresh interpreter with
this checkout's ``hostd`` importable, against the real hostd. Unit part: the README has the
blocks it promises."""

import os
import re
import subprocess
import sys
import unittest

from _support import LIVE_URL, SDK_DIR, SKIP_LIVE_REASON

README = os.path.join(SDK_DIR, "README.md")


def blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        before = text[: m.start()]
        headings = re.findall(r"^#+ (.*)$", before, re.M)
        found.append((before.count("\n") + 1, headings[-1] if headings else "", m.group(1)))
    return found


class ReadmeTest(unittest.TestCase):
    def test_has_a_python_block_for_every_scenario(self):
        titles = " | ".join(title for _, title, _ in blocks())
        for word in ("Quick start", "Exceptions", "Bash", "Streaming", "Fork", "Errors", "Tracing"):
            self.assertIn(word, titles)

    @unittest.skipUnless(LIVE_URL, SKIP_LIVE_REASON)
    def test_every_python_block_runs(self):
        env = dict(os.environ, PYTHONPATH=SDK_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for line, title, code in blocks():
            with self.subTest(line=line, title=title):
                r = subprocess.run(
                    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
                )
                report = "README.md:%d exited %d\nstdout:\n%s\nstderr:\n%s" % (
                    line, r.returncode, r.stdout, r.stderr,
                )
                self.assertEqual(r.returncode, 0, report)


if __name__ == "__main__":
    unittest.main()
