"""Rich outputs (docs/api.md, "Rich outputs"): MIME bundles as in Jupyter's display protocol.

With `display` on, an exec's rich values become `display` messages, in order with its `out`
messages: the value of the last expression when it has rich representations, figures shown
with plt.show() (repl_matplotlib.py), and `display(obj, ...)`, a builtin as in notebooks.
Without it nothing changes: the last expression prints its repr, display() prints plain text.

pandas and matplotlib are never imported here: their types are looked up in sys.modules, so
only code that already uses them pays for them.
"""

import base64
import builtins
import json
import sys

from hostd_shared import MAX_DISPLAY_LINE, encode
from repl_matplotlib import Figures
from repl_output import guarded

# IPython's conventions: method -> MIME type, in the order IPython asks them
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
_BINARY = {"image/png", "image/jpeg", "image/gif", "image/webp"}
# Values that never have a rich representation: the common case costs one set lookup
_PLAIN = {int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset, range,
          type(None), type}
TEXT_LIMIT = 1 << 16        # text/plain kept when a bundle is too big for the protocol


def mime_bundle(obj, figures=None):
    """The MIME bundle of obj: its rich representations plus text/plain (its repr)."""
    bundle = rich_representations(obj, figures) if type(obj) not in _PLAIN else {}
    bundle["text/plain"] = repr(obj)
    return bundle


def rich_representations(obj, figures=None):
    """obj's representations other than text/plain; empty if it has none."""
    if figures is not None:
        png = figures.render(obj)
        if png is not None:
            return {"image/png": png}
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        if isinstance(obj, _type_of(pandas, "DataFrame")):
            return _only_some({"text/html": _call(obj, "_repr_html_")})
        if isinstance(obj, _type_of(pandas, "Series")):    # no _repr_html_ of its own
            return _only_some({"text/html": _call(_call(obj, "to_frame"), "_repr_html_")})
    bundle = {}
    if _has_method(obj, "_repr_mimebundle_"):
        data = _call(obj, "_repr_mimebundle_", include=None, exclude=None)
        if isinstance(data, tuple):      # (data, metadata)
            data = data[0] if data else None
        if isinstance(data, dict):
            for mime, value in data.items():
                if mime != "text/plain":
                    bundle[mime] = value
    for method, mime in _REPR_METHODS:
        if mime not in bundle and _has_method(obj, method):
            bundle[mime] = _call(obj, method)
    return _only_some(bundle)


def _type_of(module, name):
    """module.name if it is a class, else a tuple isinstance() is always False for (a module
    of that name that is not the real one)."""
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) else ()


def _has_method(obj, name):
    # Looked up on the type, as IPython does: an object whose __getattr__ answers any name
    # (a mock, a proxy) has no rich representation for that.
    return getattr(type(obj), name, None) is not None


def _call(obj, name, **options):
    """obj.name(**options), or None when it fails: a broken representation is skipped, as
    IPython does (the text/plain one still shows)."""
    if obj is None:
        return None
    try:
        value = getattr(obj, name)(**options)
    except Exception:
        return None
    return value[0] if isinstance(value, tuple) and value else value


def _only_some(bundle):
    """The bundle without missing values, binary data as base64 and text as str."""
    clean = {}
    for mime, value in bundle.items():
        if value is None:
            continue
        if mime in _BINARY:
            if isinstance(value, (bytes, bytearray, memoryview)):
                value = base64.b64encode(value).decode("ascii")
        elif isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        if mime == "application/json" or mime.endswith("+json"):
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
        elif not isinstance(value, str):
            continue
        clean[mime] = value
    return clean


class Display:
    """The rich outputs of the running exec. `enabled` is the exec's `display` option."""

    def __init__(self, output):
        self.output = output
        self.figures = Figures(self)
        self.enabled = False

    def echo(self, value):
        """Shows the value of a cell's last expression: a display bundle if it has rich
        representations and the exec asked for them, else its repr on stdout. Either way it
        starts on a line of its own, after everything the cell printed."""
        if self.enabled and type(value) not in _PLAIN:
            rich = rich_representations(value, self.figures)
            if rich:
                builtins._ = value
                rich["text/plain"] = repr(value)
                self.send(rich)
                self.figures.close(value)
                return
        with guarded(self.output) as out:
            out.end_lines()
        sys.displayhook(value)           # prints the repr and sets builtins._

    def display(self, *objs, raw=False, **_options):
        """display(obj, ...): one rich output per object, as in notebooks. raw=True: each obj
        is a MIME bundle already. Other options of IPython's display() are accepted and
        ignored. Without the exec's `display` option, each object's plain text is printed."""
        for obj in objs:
            if raw:
                bundle = _only_some(dict(obj))
                bundle.setdefault("text/plain", repr(obj))
            elif self.enabled:
                bundle = mime_bundle(obj, self.figures)
            else:
                bundle = {"text/plain": repr(obj)}
            if self.enabled:
                self.send(bundle)
                if not raw:
                    self.figures.close(obj)
            else:
                print(bundle.get("text/plain", ""))

    def send(self, bundle):
        """One `display` message of the running exec. A bundle whose line would pass the
        protocol's limit goes as its (cut) text/plain alone, with a stderr line saying so."""
        with guarded(self.output) as out:
            exec_id = out.current
            if not exec_id:
                return                   # no exec runs (a thread of an earlier cell)
            line = encode({"op": "display", "id": exec_id, "data": bundle})
            if len(line) > MAX_DISPLAY_LINE:
                text = bundle.get("text/plain", "")[:TEXT_LIMIT]
                out.insert(encode({"op": "display", "id": exec_id,
                                   "data": {"text/plain": text}}))
                note = ("hostd: display output of %d bytes is over the limit of %d bytes; "
                        "sent as text/plain only\n" % (len(line), MAX_DISPLAY_LINE))
                out.feed("stderr", note.encode())
                return
            out.insert(line)
