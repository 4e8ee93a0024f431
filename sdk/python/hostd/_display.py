"""Rich outputs: a ``display`` event's MIME bundle made convenient (images as bytes, text types
as strings), keeping the bundle itself for the types this does not name."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, Optional

from ._types import Display, MimeBundle

_TEXT_FIELDS = (
    ("text", "text/plain"),
    ("html", "text/html"),
    ("markdown", "text/markdown"),
    ("latex", "text/latex"),
    ("svg", "image/svg+xml"),
)
_IMAGE_FIELDS = (("png", "image/png"), ("jpeg", "image/jpeg"))


def _decode(value: Any) -> Optional[bytes]:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value)
    except (binascii.Error, ValueError):
        return None


def to_display(data: MimeBundle) -> Display:
    """The Display of a bundle. A field is set only when the bundle has its MIME type with a
    value of the documented kind, so a malformed entry is left in ``data`` rather than guessed
    at::

        result = sandbox.run("plt.plot([1, 2]); plt.show()", display=True)
        open("plot.png", "wb").write(result.displays[0].png)
    """
    fields: Dict[str, Any] = {}
    for name, mime in _TEXT_FIELDS:
        if isinstance(data.get(mime), str):
            fields[name] = data[mime]
    for name, mime in _IMAGE_FIELDS:
        decoded = _decode(data.get(mime))
        if decoded is not None:
            fields[name] = decoded
    if "application/json" in data:
        fields["json"] = data["application/json"]
    if isinstance(data.get("application/vnd.hostd.dataframe+json"), dict):
        fields["dataframe"] = data["application/vnd.hostd.dataframe+json"]
    if isinstance(data.get("application/vnd.hostd.chart+json"), dict):
        fields["chart"] = data["application/vnd.hostd.chart+json"]
    return Display(data=data, **fields)
