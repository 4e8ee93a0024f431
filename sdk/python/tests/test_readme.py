"""The README's examples are programs: every ``python`` block runs in a fresh interpreter with
this checkout's ``hostd`` importable, against the real hostd. A block after a
``<!-- requires: files, pause -->`` line is skipped, saying why, while the server lacks one of
those features. Unit part: the README has the blocks it promises."""

import os
import re
import subprocess
import sys
import unittest

from _features import PROBES, lacks
from _support import LIVE_URL, SDK_DIR, SKIP_LIVE_REASON

README = os.path.join(SDK_DIR, "README.md")


def blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        before = text[: m.start()]
        headings = re.findall(r"^#+ (.*)$", before, re.M)
        marker = re.search(r"<!-- requires: ([^>]*) -->\n\s*$", before)
        requires = [f.strip() for f in marker.group(1).split(",")] if marker else []
        found.append((before.count("\n") + 1, headings[-1] if headings else "", m.group(1), requires))
    return found


class ReadmeTest(unittest.TestCase):
    def test_has_a_python_block_for_every_scenario(self):
        titles = " | ".join(title for _, title, _, _ in blocks())
        for word in (
            "Quick start", "asyncio", "Exceptions", "Bash", "Streaming", "Environment", "Rich outputs",
            "Fork", "Files", "Snapshots", "Pause", "Templates", "Errors", "Tracing",
        ):
            self.assertIn(word, titles)
        for _, _, _, requires in blocks():
            for feature in requires:
                self.assertIn(feature, PROBES)

    @unittest.skipUnless(LIVE_URL, SKIP_LIVE_REASON)
    def test_every_python_block_runs(self):
        env = dict(os.environ, PYTHONPATH=SDK_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for line, title, code, requires in blocks():
            with self.subTest(line=line, title=title):
                reason = lacks(*requires)
                if reason:
                    self.skipTest(reason)
                r = subprocess.run(
                    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
                )
                report = "README.md:%d exited %d\nstdout:\n%s\nstderr:\n%s" % (
                    line, r.returncode, r.stdout, r.stderr,
                )
                self.assertEqual(r.returncode, 0, report)


if __name__ == "__main__":
    unittest.main()
