#!/usr/bin/env python3
"""Files and snapshots with the Python SDK: uploads a directory of data, runs an analysis that
writes its results, downloads them, snapshots the analysed state and starts a second sandbox
from it. Reads SERVICE_HOSTD_URL and SERVICE_API_KEY; exits non-zero on failure.

    python3 examples/files-and-snapshots.py      # works installed (pip install ./sdk/python) or not
"""

import json
import os
import shutil
import sys
import tempfile

try:
    from hostd import Sandbox
except ImportError:  # not installed: use this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
    from hostd import Sandbox


def check(condition, message):
    if not condition:
        raise SystemExit("check failed: %s" % message)


local = tempfile.mkdtemp(prefix="hostd-example-")
snapshot = None
try:
    with Sandbox.create() as sandbox:
        os.mkdir(os.path.join(local, "data"))
        with open(os.path.join(local, "data", "scores.csv"), "w") as f:
            f.write("name,score\nada,90\nalan,85\ngrace,95\n")
        up = sandbox.files.upload_dir(os.path.join(local, "data"), "/root/data")
        print("uploaded %d file(s) to %s:/root/data" % (up["files"], sandbox.id))

        sandbox.run(
            "import csv, json, os\n"
            'rows = list(csv.DictReader(open("/root/data/scores.csv")))\n'
            'best = max(rows, key=lambda r: int(r["score"]))\n'
            'os.makedirs("/root/results", exist_ok=True)\n'
            'json.dump({"best": best["name"], "n": len(rows)}, open("/root/results/summary.json", "w"))'
        )
        sandbox.files.download_dir("/root/results", os.path.join(local, "results"))
        with open(os.path.join(local, "results", "summary.json")) as f:
            summary = json.load(f)
        print("downloaded results:", summary)
        check(summary == {"best": "grace", "n": 3}, summary)

        snapshot = sandbox.snapshot()
        print("snapshot %s (%d bytes)" % (snapshot.id, snapshot.info["size_bytes"]))
        with Sandbox.create(snapshot=snapshot) as copy:
            again = copy.run('print(best["name"], len(rows))')  # the REPL state came along
            print("a sandbox made from it still knows:", again.stdout.strip())
            check(again.stdout == "grace 3\n", again)
finally:
    if snapshot is not None:
        snapshot.delete()
    shutil.rmtree(local)
print("deleted; files-and-snapshots ok")
