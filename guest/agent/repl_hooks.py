"""Running code when a module is first imported, without importing it (the REPL wraps
pyplot.show and PIL's Image.show only once user code or the template's preload loads them)."""

import importlib.machinery
import sys


def when_imported(name, on_loaded):
    """Calls on_loaded(module) now if `name` is loaded, else once it is executed."""
    module = sys.modules.get(name)
    if module is not None:
        on_loaded(module)
    else:
        sys.meta_path.insert(0, _Finder(name, on_loaded))


class _Finder:
    """A meta path finder for one module: finds it as Python would, and has on_loaded(module)
    called once it is executed; then leaves sys.meta_path."""

    def __init__(self, name, on_loaded):
        self.name, self.on_loaded = name, on_loaded

    def find_spec(self, name, path, target=None):
        if name != self.name:
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
