#!/usr/bin/env python3
"""Quick start with the Python SDK: creates a sandbox, keeps Python state across runs, forks two
children, merges one back, deletes everything. Reads SERVICE_HOSTD_URL and SERVICE_API_KEY;
exits non-zero on failure.

    python3 examples/quickstart.py      # works installed (pip install ./sdk/python) or not
"""

import os
import sys

try:
    from hostd import Sandbox
except ImportError:  # not installed: use this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
    from hostd import Sandbox


def check(condition, message):
    if not condition:
        raise SystemExit("check failed: %s" % message)


with Sandbox.create() as sandbox:
    print("created", sandbox.id)

    sandbox.run("import math\nvalues = [math.pi]")
    first = sandbox.run("values.append(2 * values[0])\nprint(len(values), round(values[-1], 4))")
    print("state persists:", first.stdout.strip())
    check(first.stdout == "2 6.2832\n" and first.exit_code == 0, first)

    children = sandbox.fork(2)
    print("forked", " ".join(c.id for c in children))
    try:
        for i, child in enumerate(children):
            r = child.run(
                "values.append(%d)\nprint(values[-1])" % i,
                on_stdout=lambda line, i=i: print("  child %d says %s" % (i, line)),
            )
            check(r.stdout == "%d\n" % i, r)

        sandbox.merge(children[1])
        merged = sandbox.run("print(values[-1], len(values))")
        print("after merging child 1 the parent has:", merged.stdout.strip())
        check(merged.stdout == "1 3\n", merged)
    finally:
        for child in children:
            try:
                child.delete()
            except Exception:  # the merged winner is already gone
                pass
print("deleted; quickstart ok")
