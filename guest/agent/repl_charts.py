"""The data behind a matplotlib figure, as JSON (docs/api.md, "Notebook mode": charts).

A notebook-mode display of a figure carries, besides its PNG, what the figure plots: the kind
of chart, its titles, axis labels, units and ticks, and its elements (the points of each line
or scatter, the bars, the pie's wedges, the boxes' statistics), so that a program reading the
result gets numbers rather than pixels. The shape is the one E2B's code interpreter gives
(docs/e2b.md), written here from matplotlib's own API:

  chart    {"type", "title", "elements": [...]}; "unknown" when the axes hold something else
  2D       + "x_label", "y_label", "x_unit", "y_unit" (the "(s)" or "[Hz]" part of a label)
  line, scatter  + "x_ticks", "x_tick_labels", "x_scale", "y_ticks", "y_tick_labels",
           "y_scale"; elements {"label", "points": [[x, y], ...]} (dates as ISO strings)
  bar      elements {"label", "group", "value"}
  pie      elements {"label", "angle" (degrees), "radius"}
  box_and_whisker  elements {"label", "min", "first_quartile", "median", "third_quartile",
           "max", "outliers": [...]}
  superchart  a figure with several axes: {"type", "title" (its suptitle), "elements": [chart]}

For bars and boxes, "x" is the axis of the categories and "y" that of the values, whichever
way they are drawn. Values are plain JSON: NaN and infinities become null. matplotlib is
never imported here: a figure exists only once the user's code has imported it.
"""

import datetime
import math
import re
import sys

CHART_MIME = "application/vnd.hostd.chart+json"
_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")
_SIGNIFICANT = 12           # statistics without float noise (84.75000000000001)
# pie() computes its fractions in float32: its angles are good to 7 digits (324, not 323.99999)


def chart_of(figure):
    """The chart of a figure, or None for a blank one (no axes with data). Call it after the
    figure was drawn (rendered), so that tick labels are set."""
    axes = [ax for ax in figure.get_axes() if ax.get_label() != "<colorbar>"]
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return _chart_of_axes(axes[0])
    return {"type": "superchart", "title": _suptitle(figure),
            "elements": [_chart_of_axes(ax) for ax in axes]}


def _suptitle(figure):
    getter = getattr(figure, "get_suptitle", None)     # matplotlib >= 3.8
    if getter is not None:
        return getter() or None
    text = getattr(figure, "_suptitle", None)
    return (text.get_text() or None) if text is not None else None


# ---- what kind of chart --------------------------------------------------------------------

def _kind(ax):
    mpl = _Matplotlib()
    artists = [a for a in _user_artists(ax) if not isinstance(a, mpl.Text)]
    if all(isinstance(a, mpl.Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (mpl.PathPatch, mpl.Line2D)) for a in artists):
        return "box_and_whisker"
    artists = [a for a in artists if not (isinstance(a, mpl.Line2D) and _is_rule(a))]
    for kind, cls in (("scatter", mpl.PathCollection), ("pie", mpl.Wedge),
                      ("bar", mpl.Rectangle)):
        if all(isinstance(a, cls) for a in artists):
            return kind
    return "unknown"


def _user_artists(ax):
    """What the user's code put on the axes (lines, patches, collections, images, texts...),
    not the axes' own furniture (spines, axis, background, legend)."""
    found = []
    for group in ("lines", "patches", "collections", "images", "texts", "tables", "artists"):
        found.extend(getattr(ax, group, ()))
    unique = {id(a): a for a in found}
    return list(unique.values())


def _is_rule(line):
    """A straight horizontal or vertical segment of two points (axhline, axvline, a grid line
    drawn by hand): furniture rather than data."""
    x, y = list(line.get_xdata()), list(line.get_ydata())
    return len(x) == 2 and len(y) == 2 and (_same(x[0], x[1]) or _same(y[0], y[1]))


def _chart_of_axes(ax):
    kind = _kind(ax)
    chart = {"type": kind, "title": _title(ax), "elements": []}
    if kind in ("line", "scatter"):
        chart.update(_labels(ax, swap=False))
        chart.update(_ticks(ax))
        chart["elements"] = _lines(ax) if kind == "line" else _scatters(ax)
    elif kind == "bar":
        horizontal, elements = _bars(ax)
        chart.update(_labels(ax, swap=horizontal))
        chart["elements"] = elements
    elif kind == "box_and_whisker":
        horizontal, elements = _boxes(ax)
        chart.update(_labels(ax, swap=horizontal))
        chart["elements"] = elements
    elif kind == "pie":
        chart["elements"] = [{"label": str(w.get_label()),
                              "angle": _tidy(abs(float(w.theta2) - float(w.theta1)), 7),
                              "radius": _number(w.r)} for w in ax.patches]
    return chart


def _title(ax):
    for loc in ("center", "left", "right"):
        text = ax.get_title(loc)
        if text:
            return text
    return None


def _labels(ax, swap):
    x, y = ax.get_xlabel() or None, ax.get_ylabel() or None
    if swap:
        x, y = y, x
    return {"x_label": x, "y_label": y, "x_unit": _unit(x), "y_unit": _unit(y)}


def _unit(label):
    match = _UNIT.search(label) if label else None
    return (match.group(1) or match.group(2)) if match else None


# ---- axes, ticks and scales ----------------------------------------------------------------

def _ticks(ax):
    fields = {}
    for name, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        ticks = list(axis.get_ticklocs())
        labels = [t.get_text() for t in axis.get_ticklabels()]
        dates = _is_date_axis(axis)
        fields[name + "_ticks"] = [_date_number(t) if dates else _number(t) for t in ticks]
        fields[name + "_tick_labels"] = labels
        fields[name + "_scale"] = _scale(axis, scale, ticks, labels, dates)
    return fields


def _is_date_axis(axis):
    dates = sys.modules.get("matplotlib.dates")
    if dates is None:
        return False
    locator = axis.get_major_locator()
    if isinstance(locator, getattr(dates, "DateLocator", ())):
        return True
    converter = getattr(axis, "get_converter", lambda: axis.converter)()
    return converter is not None and "Date" in type(converter).__name__


def _scale(axis, scale, ticks, labels, dates):
    if dates:
        return "datetime"
    if scale != "linear":
        return scale                     # log, symlog, logit, function...
    category = sys.modules.get("matplotlib.category")
    converter = getattr(axis, "get_converter", lambda: axis.converter)()
    if category is not None and isinstance(converter, category.StrCategoryConverter):
        return "categorical"
    # Labels put by hand at 0, 1, ..., n-1 (plt.xticks(range(n), names)) name categories too
    ticker = sys.modules.get("matplotlib.ticker")
    fixed = ticker is not None and isinstance(axis.get_major_formatter(), ticker.FixedFormatter)
    if fixed and ticks and all(_same(t, i) and label != str(i)
                               for i, (t, label) in enumerate(zip(ticks, labels))):
        return "categorical"
    return "linear"


# ---- elements ------------------------------------------------------------------------------

def _lines(ax):
    elements = []
    for line in ax.get_lines():
        if _is_rule(line):
            continue
        label = str(line.get_label())
        if label.startswith("_child") and label[6:].isdigit():
            label = "Line %s" % label[6:]
        points = [[_point(x), _point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
        elements.append({"label": label, "points": points})
    return elements


def _scatters(ax):
    x_dates, y_dates = _is_date_axis(ax.xaxis), _is_date_axis(ax.yaxis)
    elements = []
    for collection in ax.collections:
        points = []
        for x, y in collection.get_offsets():
            points.append([_date_number(x) if x_dates else _number(x),
                           _date_number(y) if y_dates else _number(y)])
        elements.append({"label": str(collection.get_label()), "points": points})
    return elements


def _bars(ax):
    """(horizontal, elements): one element per bar, labelled by the category tick it stands on."""
    container_cls = _Matplotlib().BarContainer
    horizontal = False
    elements = []
    for container in ax.containers:
        if not isinstance(container, container_cls):
            continue
        group = str(container.get_label())
        if group.startswith("_container") and group[10:].isdigit():
            group = "Group %s" % group[10:]
        orientation = getattr(container, "orientation", None)
        if orientation is None:          # matplotlib < 3.4: bars of one height lie down
            heights = [r.get_height() for r in container]
            orientation = "horizontal" if len(set(heights)) == 1 and len(heights) > 1 else "vertical"
        horizontal = orientation == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        names = _tick_names(axis)
        values = getattr(container, "datavalues", None)
        for i, rect in enumerate(container):
            if horizontal:
                center, size = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                center, size = rect.get_x() + rect.get_width() / 2, rect.get_height()
            value = values[i] if values is not None and i < len(values) else size
            elements.append({"label": _name_at(names, center), "group": group,
                             "value": _number(value)})
    return horizontal, elements


def _boxes(ax):
    """(horizontal, elements): a box plot's statistics, read back from its artists: the box
    spans the quartiles, the median is the segment across it, the whiskers reach min and max,
    and the marker-only lines over a box are its outliers."""
    mpl = _Matplotlib()
    spans = []
    for patch in ax.patches:
        if not isinstance(patch, mpl.PathPatch):
            continue
        vertices = patch.get_path().vertices
        xs, ys = [float(v) for v in vertices[:, 0]], [float(v) for v in vertices[:, 1]]
        spans.append(((min(xs), max(xs)), (min(ys), max(ys))))
    lines = [(list(map(float, l.get_xdata())), list(map(float, l.get_ydata())), l)
             for l in ax.get_lines()]
    horizontal = _boxes_lie_down(spans, lines)
    names = _tick_names(ax.yaxis if horizontal else ax.xaxis)
    elements = []
    for (xspan, yspan) in spans:
        (c0, c1), (q1, q3) = (yspan, xspan) if horizontal else (xspan, yspan)
        low, high, median, outliers = q1, q3, None, []
        for xs, ys, line in lines:
            cs, vs = (ys, xs) if horizontal else (xs, ys)
            if not cs or not all(c0 - _eps(c0) <= c <= c1 + _eps(c1) for c in cs):
                continue                                       # another box's
            if str(line.get_linestyle()).lower() in ("none", "", " "):
                outliers.extend(vs)                            # fliers: markers only
            elif (len(cs) == 2 and _same(vs[0], vs[1]) and _same(min(cs), c0)
                  and _same(max(cs), c1)):
                median = vs[0]                                 # across the whole box
            else:
                low, high = min([low] + vs), max([high] + vs)  # whiskers and caps
        elements.append({
            "label": _name_at(names, (c0 + c1) / 2), "min": _tidy(low),
            "first_quartile": _tidy(q1), "median": _tidy(median), "third_quartile": _tidy(q3),
            "max": _tidy(high), "outliers": [_tidy(v) for v in outliers]})
    return horizontal, elements


def _boxes_lie_down(spans, lines):
    """Whether the boxes are drawn horizontally (vert=False): their medians are vertical."""
    for (x0, x1), (y0, y1) in spans:
        for xs, ys, _ in lines:
            if len(xs) != 2:
                continue
            if _same(xs[0], x0) and _same(xs[1], x1) and _same(ys[0], ys[1]) and y0 <= ys[0] <= y1:
                return False
            if _same(ys[0], y0) and _same(ys[1], y1) and _same(xs[0], xs[1]) and x0 <= xs[0] <= x1:
                return True
    # No median found: boxes of one width stand up, of one height lie down
    widths = {round(x1 - x0, 9) for (x0, x1), _ in spans}
    heights = {round(y1 - y0, 9) for _, (y0, y1) in spans}
    return len(heights) == 1 and len(widths) > 1


def _tick_names(axis):
    return list(zip([float(t) for t in axis.get_ticklocs()],
                    [t.get_text() for t in axis.get_ticklabels()]))


def _name_at(names, position):
    """The label of the tick at `position` (a bar's or a box's center), else the position."""
    for tick, label in names:
        if _same(tick, position) and label:
            return label
    return "%g" % position


# ---- values --------------------------------------------------------------------------------

def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def _tidy(value, significant=_SIGNIFICANT):
    """A statistic or an angle, without float noise."""
    if value is None:
        return None
    number = _number(value)
    if not isinstance(number, float) or number == 0:
        return number
    return float("%.*g" % (significant, number))


def _point(value):
    """A data point as JSON: dates as ISO strings, numbers as numbers, categories as text."""
    if isinstance(value, (datetime.date, datetime.time)):    # datetime and pandas too
        return value.isoformat()
    if isinstance(value, str):
        return value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.datetime64):
        return str(numpy.datetime_as_string(value, unit="s"))
    return _number(value)


def _date_number(value):
    """A position on a date axis (days since matplotlib's epoch) as an ISO string."""
    number = _number(value)
    if not isinstance(number, float):
        return number
    try:
        return sys.modules["matplotlib.dates"].num2date(number).isoformat()
    except (ValueError, OverflowError, KeyError):
        return number


def _same(a, b):
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return a == b


def _eps(value):
    return max(abs(value) * 1e-9, 1e-12)


class _Matplotlib:
    """matplotlib's artist classes, looked up where the user's imports loaded them."""

    def __init__(self):
        m = sys.modules
        self.Line2D = m["matplotlib.lines"].Line2D
        self.Text = m["matplotlib.text"].Text
        patches = m["matplotlib.patches"]
        self.PathPatch, self.Wedge, self.Rectangle = (patches.PathPatch, patches.Wedge,
                                                      patches.Rectangle)
        self.PathCollection = m["matplotlib.collections"].PathCollection
        self.BarContainer = m["matplotlib.container"].BarContainer
