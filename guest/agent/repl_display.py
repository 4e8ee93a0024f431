"""Rich outputs (docs/api.md, "Rich outputs"): MIME bundles as in Jupyter's display protocol.

With `display` on, an exec's rich values become `display` messages, in order with its `out`
messages: the value of the last expression when it has rich representations, figures shown
with plt.show() (repl_matplotlib.py), and `display(obj, ...)`, a builtin as in notebooks.
Without it nothing changes: the last expression prints its repr, display() prints plain text.

In notebook mode (docs/api.md, "Notebook mode") display is on, the last expression's value is
a `result` message whatever it is (text/plain at least), an uncaught exception an `exception`
message, and bundles carry the data behind them: a DataFrame's columns
(DATA_MIME, `to_dict(orient="list")` made JSON-safe), a figure's chart (CHART_MIME,
repl_charts.py), a list's or dict's JSON.

pandas and matplotlib are never imported here: their types are looked up in sys.modules, so
only code that already uses them pays for them.
"""

import base64
import builtins
import datetime
import json
import math
import sys
import warnings

from hostd_wire import MAX_DISPLAY_LINE, encode
from repl_charts import CHART_MIME
from repl_matplotlib import Figures
from repl_output import guarded

DATA_MIME = "application/vnd.hostd.dataframe+json"
# What a bundle over the size limit loses first, before it falls back to text/plain alone
_OPTIONAL = (DATA_MIME, CHART_MIME, "application/json")
MAX_DATA_CELLS = 2_000_000  # a frame bigger than this cannot fit a line anyway: not converted
MAX_JSON_ITEMS = 200_000    # values visited for a list's or dict's JSON before giving up
MAX_TRACEBACK = 1 << 20     # an exception message is a line of at most 1 MiB

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


def mime_bundle(obj, figures=None, notebook=False):
    """The MIME bundle of obj: its rich representations plus text/plain (its repr)."""
    kind = type(obj)
    bundle = rich_representations(obj, figures, notebook) if kind not in _PLAIN else {}
    if notebook and kind in (list, dict):
        value = json_value(obj, [MAX_JSON_ITEMS])
        if value is not _NOT_JSON:
            bundle["application/json"] = value
    bundle["text/plain"] = repr(obj)
    return bundle


def rich_representations(obj, figures=None, notebook=False):
    """obj's representations other than text/plain; empty if it has none."""
    if figures is not None:
        bundle = figures.bundle(obj, notebook)
        if bundle is not None:
            return bundle
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        if isinstance(obj, _type_of(pandas, "DataFrame")):
            bundle = _only_some({"text/html": _call(obj, "_repr_html_")})
            if notebook:
                data = frame_data(obj)
                if data is not None:
                    bundle[DATA_MIME] = data
            return bundle
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
                json.dumps(value, allow_nan=False)  # NaN: not JSON
            except (TypeError, ValueError):
                continue
        elif not isinstance(value, str):
            continue
        clean[mime] = value
    return clean


def frame_data(frame):
    """A DataFrame's columns as JSON: {column: [value, ...]} (`to_dict(orient="list")`), with
    dates as ISO strings, NaN and NaT as null, other objects as their str(). None for a frame
    too big to send."""
    try:
        if frame.size > MAX_DATA_CELLS:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # duplicate column names: pandas warns
            columns = frame.to_dict(orient="list")
    except Exception:
        return None
    budget = [MAX_DATA_CELLS]
    data = {}
    for name, values in columns.items():
        data[name if isinstance(name, str) else str(name)] = [
            _scalar(v, budget) for v in values]
    return data


_NOT_JSON = object()


def json_value(obj, budget, depth=0):
    """obj as a JSON value (numpy's numbers and arrays too, keys as strings), or _NOT_JSON
    when it holds something else, is too deep or too big (budget: values left to visit)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 64:
        return _NOT_JSON
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (list, tuple)):
        items = [json_value(v, budget, depth + 1) for v in obj]
        return _NOT_JSON if any(v is _NOT_JSON for v in items) else items
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            v = json_value(v, budget, depth + 1)
            if v is _NOT_JSON:
                return _NOT_JSON
            out[k if isinstance(k, str) else str(k)] = v
        return out
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(obj, numpy.generic):
            return json_value(obj.item(), budget, depth + 1)
        if isinstance(obj, numpy.ndarray):
            budget[0] -= obj.size
            return _NOT_JSON if budget[0] < 0 else json_value(obj.tolist(), budget, depth + 1)
    return _NOT_JSON


def _scalar(value, budget):
    """One value of a DataFrame as JSON."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    pandas = sys.modules.get("pandas")
    if pandas is not None and (value is getattr(pandas, "NaT", 0)
                               or value is getattr(pandas, "NA", 0)):
        return None
    if isinstance(value, (datetime.date, datetime.time)):    # pandas' Timestamp too
        return value.isoformat()
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        if isinstance(value, (numpy.datetime64, numpy.timedelta64)):
            return None if numpy.isnat(value) else str(value)
        return _scalar(value.item(), budget)
    if isinstance(value, (list, tuple, dict)):
        converted = json_value(value, budget)
        if converted is not _NOT_JSON:
            return converted
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    try:
        number = float(value) if type(value).__name__ == "Decimal" else None
    except (TypeError, ValueError):
        number = None
    if number is not None:
        return number if math.isfinite(number) else None
    return str(value)


class Display:
    """The rich outputs of the running exec. `enabled` is the exec's `display` option,
    `notebook` its notebook mode (which has display on)."""

    def __init__(self, output):
        self.output = output
        self.figures = Figures(self)
        self.enabled = False
        self.notebook = False

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

    def result(self, value):
        """Notebook mode: the value of the cell's last expression, whatever it is, as its
        `result` message (text/plain at least), after everything the cell printed."""
        builtins._ = value
        self.send(mime_bundle(value, self.figures, notebook=True), op="result")
        self.figures.close(value)

    def exception(self, exc, traceback_text):
        """Notebook mode: an uncaught exception as an `exception` message: its class name,
        its message and its traceback."""
        try:
            value = str(exc)
        except Exception:
            value = "<exception str() failed>"
        with guarded(self.output) as out:
            exec_id = out.current
            if not exec_id:
                return
            out.insert(encode({"op": "exception", "id": exec_id, "name": type(exc).__name__,
                               "value": value[:MAX_TRACEBACK // 4],
                               "traceback": traceback_text[-(MAX_TRACEBACK // 2):]}))

    def display(self, *objs, raw=False, **_options):
        """display(obj, ...): one rich output per object, as in notebooks. raw=True: each obj
        is a MIME bundle already. Other options of IPython's display() are accepted and
        ignored. Without the exec's `display` option, each object's plain text is printed."""
        for obj in objs:
            if raw:
                bundle = _only_some(dict(obj))
                bundle.setdefault("text/plain", repr(obj))
            elif self.enabled:
                bundle = mime_bundle(obj, self.figures, self.notebook)
            else:
                bundle = {"text/plain": repr(obj)}
            if self.enabled:
                self.send(bundle)
                if not raw:
                    self.figures.close(obj)
            else:
                print(bundle.get("text/plain", ""))

    def send(self, bundle, op="display"):
        """One `display` (or `result`) message of the running exec. A bundle whose line would
        pass the protocol's limit loses its data first (a frame's columns, a chart, JSON),
        then goes as its (cut) text/plain alone, with a stderr line saying so."""
        with guarded(self.output) as out:
            exec_id = out.current
            if not exec_id:
                return                   # no exec runs (a thread of an earlier cell)
            line = encode({"op": op, "id": exec_id, "data": bundle})
            if len(line) > MAX_DISPLAY_LINE and any(m in bundle for m in _OPTIONAL):
                bundle = {m: v for m, v in bundle.items() if m not in _OPTIONAL}
                line = encode({"op": op, "id": exec_id, "data": bundle})
            if len(line) > MAX_DISPLAY_LINE:
                text = bundle.get("text/plain", "")[:TEXT_LIMIT]
                out.insert(encode({"op": op, "id": exec_id,
                                   "data": {"text/plain": text}}))
                note = ("hostd: display output of %d bytes is over the limit of %d bytes; "
                        "sent as text/plain only\n" % (len(line), MAX_DISPLAY_LINE))
                out.feed("stderr", note.encode())
                return
            out.insert(line)
