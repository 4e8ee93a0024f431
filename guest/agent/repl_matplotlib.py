"""matplotlib figures (and PIL images) as rich outputs: plt.show(), a figure (or Axes) as a
cell's value, and in notebook mode every figure a cell leaves open, as Jupyter's inline backend
shows them.

matplotlib is never imported here. Once user code or the template's preload has loaded
matplotlib.pyplot (an import hook notices), its show() is wrapped: in an exec with `display` on,
it renders every open figure as a PNG display bundle and closes it, so memory does not grow
cell after cell; otherwise the original show() runs (a no-op under the Agg backend). In
notebook mode a figure's bundle also carries its chart (repl_charts.py), and PIL's
Image.show() and Image.save(path) display the image, as E2B's code interpreter does.
"""

import base64
import functools
import io
import os
import sys

from repl_charts import CHART_MIME, chart_of
from repl_hooks import when_imported

PYPLOT = "matplotlib.pyplot"


class Figures:
    def __init__(self, display):
        self.display = display

    def install(self):
        """Wraps pyplot.show and PIL's Image.show and Image.save now if they are loaded, else
        as soon as they are."""
        when_imported(PYPLOT, self._wrap_show)
        when_imported("PIL.Image", self._wrap_image)

    def bundle(self, obj, notebook=False):
        """The rich bundle of obj if it is a figure or an Axes (its PNG, and in notebook mode
        its chart), else None."""
        figure = figure_of(obj)
        return None if figure is None else figure_bundle(figure, notebook)

    def close(self, obj):
        """Closes the figure obj is or draws on, once it was displayed."""
        figure, pyplot = figure_of(obj), sys.modules.get(PYPLOT)
        if figure is not None and pyplot is not None:
            pyplot.close(figure)

    def show_all(self, pyplot):
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            bundle = figure_bundle(figure, self.display.notebook)
            bundle["text/plain"] = repr(figure)
            self.display.send(bundle)
            pyplot.close(figure)

    def flush(self):
        """The end of a notebook cell: the figures it left open are shown (and closed)."""
        pyplot = sys.modules.get(PYPLOT)
        if pyplot is not None and pyplot.get_fignums():
            self.show_all(pyplot)

    def _active(self):
        return self.display.enabled and self.display.output.current

    def _wrap_show(self, pyplot):
        original = pyplot.show
        if getattr(original, "_hostd_display", False):
            return

        @functools.wraps(original)
        def show(*args, **kwargs):
            if self._active():
                return self.show_all(pyplot)
            return original(*args, **kwargs)
        show._hostd_display = True
        pyplot.show = show

    def _wrap_image(self, module):
        image_cls = getattr(module, "Image", None)
        if not isinstance(image_cls, type) or getattr(image_cls.show, "_hostd_display", False):
            return
        original_show, original_save = image_cls.show, image_cls.save
        display = self.display

        @functools.wraps(original_show)
        def show(image, *args, **kwargs):
            if display.notebook and self._active():
                return display.display(image)
            return original_show(image, *args, **kwargs)

        @functools.wraps(original_save)
        def save(image, fp, *args, **kwargs):
            result = original_save(image, fp, *args, **kwargs)
            # A save by the user's code, not by matplotlib's savefig("x.jpg") or PIL itself
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (display.notebook and self._active() and isinstance(fp, (str, os.PathLike))
                    and not caller.startswith(("matplotlib", "PIL"))):
                display.display(image)
            return result
        show._hostd_display = save._hostd_display = True
        image_cls.show, image_cls.save = show, save


def figure_bundle(figure, notebook):
    bundle = {"image/png": png(figure)}  # drawn first: the chart reads its tick labels
    if notebook:
        try:
            chart = chart_of(figure)
        except Exception:                # a figure we cannot read still shows
            chart = None
        if chart is not None:
            bundle[CHART_MIME] = chart
    return bundle


def figure_of(obj):
    """The matplotlib Figure obj is, or the one an Axes obj draws on; else None."""
    figure_cls = _class(sys.modules.get("matplotlib.figure"), "Figure")
    if figure_cls is None:
        return None                      # no figure can exist
    if isinstance(obj, figure_cls):
        return obj
    axes_cls = _class(sys.modules.get("matplotlib.axes"), "Axes")
    if axes_cls is not None and isinstance(obj, axes_cls):
        return obj.figure
    return None


def png(figure):
    buf = io.BytesIO()
    figure.savefig(buf, format="png", bbox_inches="tight")   # as Jupyter's inline backend
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _class(module, name):
    cls = getattr(module, name, None) if module is not None else None
    return cls if isinstance(cls, type) else None
