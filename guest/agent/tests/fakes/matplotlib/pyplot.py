"""pyplot's figure registry: figures stay open until closed."""

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

_open = {}
_numbers = iter(range(1, 1000))


def figure(num=None):
    if num in _open:
        return _open[num]
    fig = Figure(next(_numbers))
    _open[fig.number] = fig
    return fig


def subplots():
    fig = figure()
    return fig, Axes(fig)


def get_fignums():
    return sorted(_open)


def close(fig):
    _open.pop(fig.number, None)


def show(*args, **kwargs):
    matplotlib.native_shows.append(get_fignums())
