#!/usr/bin/env python3
"""Makes hello/wheels/hostd_hello-1.0.0-py3-none-any.whl from hello/src, with Python's standard
library only (the host needs no pip, setuptools or wheel). A wheel is a zip file: the package's
files plus NAME-VERSION.dist-info/{METADATA,WHEEL,RECORD}. Entries are sorted and their times
fixed, so the same source gives the same bytes and the template's key changes only when the
source does. Binary wheels are not committed; this runs before the template is built.
"""

import base64
import hashlib
import os
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME, DIST, VERSION = "hostd-hello", "hostd_hello", "1.0.0"
SRC = os.path.join(HERE, "hello", "src")
OUT = os.path.join(HERE, "hello", "wheels")
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def main():
    files = {}
    for dirpath, dirnames, filenames in os.walk(SRC):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, SRC)] = f.read()
    info = f"{DIST}-{VERSION}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
        "Summary: The worked example of docs/templates.md\n").encode()
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: make-wheel.py\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()
    record = "".join(f"{p},{record_hash(d)},{len(d)}\n" for p, d in sorted(files.items()))
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    os.makedirs(OUT, exist_ok=True)
    wheel = os.path.join(OUT, f"{DIST}-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(files):
            entry = zipfile.ZipInfo(path, EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, files[path])
    print(wheel)


if __name__ == "__main__":
    main()
