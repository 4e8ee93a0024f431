"""A PEP 517 build backend using only the standard library, so that installing this package
needs nothing from PyPI (pip's isolated build environment has nothing to download).

It builds a pure-Python wheel of the ``hostd`` package, an sdist, and PEP 660 editable wheels
(a ``.pth`` file pointing at this directory). Metadata comes from ``[project]`` in
pyproject.toml.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "hostd"


def _project() -> Dict[str, str]:
    """The ``key = "value"`` lines of the [project] table (enough for this file's needs)."""
    fields: Dict[str, str] = {}
    section = None
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            header = re.match(r"^\[([^\]]+)\]$", line)
            if header:
                section = header.group(1)
                continue
            pair = re.match(r'^([A-Za-z0-9_-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(#.*)?$', line)
            if section == "project" and pair:
                fields[pair.group(1)] = pair.group(2)
    return fields


def _names() -> Tuple[str, str]:
    project = _project()
    return project["name"], project["version"]


def _metadata() -> bytes:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % project["name"],
        "Version: %s" % project["version"],
        "Summary: %s" % project.get("description", ""),
        "Requires-Python: %s" % project.get("requires-python", ">=3.9"),
        "License: %s" % project.get("license", ""),
    ]
    readme = project.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _wheel_file() -> bytes:
    return b"Wheel-Version: 1.0\nGenerator: hostd_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, path on disk) of every file of the package, sorted for reproducibility."""
    files = []
    for directory, subdirs, names in os.walk(os.path.join(ROOT, PACKAGE)):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".py", ".typed")):
                path = os.path.join(directory, name)
                files.append((os.path.relpath(path, ROOT).replace(os.sep, "/"), path))
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _dist_info() -> str:
    name, version = _names()
    return "%s-%s.dist-info" % (name.replace("-", "_"), version)


def _write_wheel(wheel_directory: str, entries: List[Tuple[str, bytes]]) -> str:
    name, version = _names()
    filename = "%s-%s-py3-none-any.whl" % (name.replace("-", "_"), version)
    dist_info = _dist_info()
    entries = entries + [
        (dist_info + "/METADATA", _metadata()),
        (dist_info + "/WHEEL", _wheel_file()),
    ]
    record = "\n".join([_record_line(n, d) for n, d in entries] + [dist_info + "/RECORD,,", ""])
    epoch = (1980, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries + [(dist_info + "/RECORD", record.encode("utf-8"))]:
            info = zipfile.ZipInfo(arcname, date_time=epoch)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return filename


def _write_metadata_dir(metadata_directory: str) -> str:
    target = os.path.join(metadata_directory, _dist_info())
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(target, "WHEEL"), "wb") as f:
        f.write(_wheel_file())
    return _dist_info()


# PEP 517 hooks


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Optional[dict] = None
) -> str:
    return _write_metadata_dir(metadata_directory)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Optional[dict] = None
) -> str:
    return _write_metadata_dir(metadata_directory)


def build_wheel(
    wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None
) -> str:
    entries = []
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            entries.append((arcname, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(
    wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None
) -> str:
    name, _ = _names()
    return _write_wheel(wheel_directory, [("__editable__.%s.pth" % name, (ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    name, version = _names()
    base = "%s-%s" % (name, version)
    paths = ["pyproject.toml", "README.md"] + [a for a, _ in _package_files()]
    paths += ["_build/" + n for n in sorted(os.listdir(os.path.join(ROOT, "_build"))) if n.endswith(".py")]
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in paths:
            with open(os.path.join(ROOT, rel), "rb") as f:
                _add_bytes(tar, "%s/%s" % (base, rel), f.read())
        _add_bytes(tar, base + "/PKG-INFO", _metadata())
    return filename


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    tar.addfile(info, io.BytesIO(data))
