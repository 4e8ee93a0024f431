"""matplotlib figures as rich outputs: plt.show(), and a figure (or Axes) as a cell's value.

matplotlib is never imported here. Once user code or the template's preload has loaded
matplotlib.pyplot (an import hook notices), its show() is wrapped: in an exec with `display` on,
it renders every open figure as a PNG display bundle and closes it, so memory does not grow
cell after cell; otherwise the original show() runs (a no-op under the Agg backend).
"""

import base64
import functools
import importlib.machinery
import io
import sys

PYPLOT = "matplotlib.pyplot"


class Figures:
    def __init__(self, display):
        self.display = display

    def install(self):
        """Wraps pyplot.show now if pyplot is loaded, else as soon as it is."""
        pyplot = sys.modules.get(PYPLOT)
        if pyplot is not None:
            self._wrap_show(pyplot)
        else:
            sys.meta_path.insert(0, _PyplotFinder(self._wrap_show))

    def render(self, obj):
        """The PNG (base64) of obj if it is a figure or an Axes, else None."""
        figure = figure_of(obj)
        return None if figure is None else png(figure)

    def close(self, obj):
        """Closes the figure obj is or draws on, once it was displayed."""
        figure, pyplot = figure_of(obj), sys.modules.get(PYPLOT)
        if figure is not None and pyplot is not None:
            pyplot.close(figure)

    def show_all(self, pyplot):
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            self.display.send({"image/png": png(figure), "text/plain": repr(figure)})
            pyplot.close(figure)

    def _wrap_show(self, pyplot):
        original = pyplot.show
        if getattr(original, "_hostd_display", False):
            return
        display = self.display

        @functools.wraps(original)
        def show(*args, **kwargs):
            if display.enabled and display.output.current:
                return self.show_all(pyplot)
            return original(*args, **kwargs)
        show._hostd_display = True
        pyplot.show = show


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


class _PyplotFinder:
    """A meta path finder for matplotlib.pyplot alone: finds it as Python would, and has
    on_loaded(module) called once it is executed; then leaves sys.meta_path."""

    def __init__(self, on_loaded):
        self.on_loaded = on_loaded

    def find_spec(self, name, path, target=None):
        if name != PYPLOT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._loaded)
        return spec

    def _loaded(self, module):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.on_loaded(module)


class _Loader:
    """Delegates to the real loader, then reports the executed module."""

    def __init__(self, loader, on_loaded):
        self._loader, self._on_loaded = loader, on_loaded

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._on_loaded(module)

    def __getattr__(self, name):         # get_source, get_resource_reader, ...
        return getattr(self._loader, name)
