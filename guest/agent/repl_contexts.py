"""Contexts: independent Python states in the one REPL worker (docs/api.md, "Contexts").

A context is a namespace (its own `__main__` module), a working directory and an execution
count. The default context is the worker's own namespace, where execs without a `context`
run, and its directory is the process's. Another context's cell runs with its module as
`__main__` (so pickle and multiprocessing find its classes) and in its directory; afterwards
its directory is remembered and the process goes back to the default context's.

Why namespaces in one process rather than a process per context: a context then costs an
empty dict, not a second Python with the template's preloaded numpy, pandas and matplotlib
(~100 MiB of a 1 GiB guest, and under TCG seconds to start), and it needs nothing new from
the agent, the ports, cancels or fork: a fork copies every context with the VM. The price is
isolation: contexts share the process, so its modules, os.environ, threads, signal handlers
and global library state (matplotlib's list of open figures) are common, cells of different
contexts run one at a time like every exec of a sandbox, and a worker that dies loses them
all (the next one starts with the default context only).
"""

import os
import re
import sys
import types

DEFAULT = "default"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ContextError(Exception):
    """A context request that cannot be served; `code` is the protocol's error code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Context:
    def __init__(self, context_id, cwd, module):
        self.id = context_id
        self.cwd = cwd                   # None for the default context: the process's
        self.initial_cwd = cwd
        self.module = module
        self.count = 0                   # notebook cells run in it

    def info(self):
        cwd = self.cwd
        if cwd is None:
            try:
                cwd = os.getcwd()
            except OSError:              # a cell deleted it
                cwd = ""
        return {"id": self.id, "cwd": cwd, "execution_count": self.count}


def new_module(builtins):
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    return module


class Contexts:
    def __init__(self, main_module, builtins, on_default_module):
        self.builtins = builtins
        self.on_default_module = on_default_module   # the worker's __main__ changes (restart)
        self.default = Context(DEFAULT, None, main_module)
        try:
            self.default.initial_cwd = os.getcwd()
        except OSError:
            pass
        self.others = {}                 # id -> Context, in creation order

    def get(self, context_id):
        """The context an exec names (None: the default one), or None if there is none."""
        if context_id is None or context_id == DEFAULT:
            return self.default
        return self.others.get(context_id)

    def list(self):
        return [self.default.info()] + [c.info() for c in self.others.values()]

    def create(self, context_id, cwd):
        if context_id is None:
            context_id = os.urandom(8).hex()
        elif not _ID.match(context_id):
            raise ContextError("invalid_context_id", "a context id is 1 to 64 letters, digits, "
                               "'_', '.' or '-', starting with a letter or digit")
        if context_id == DEFAULT or context_id in self.others:
            raise ContextError("context_exists", "context %s already exists" % context_id)
        if cwd is None:
            cwd = self.default.info()["cwd"] or "/"
        elif not os.path.isabs(cwd):
            raise ContextError("invalid_cwd", "cwd must be an absolute path: %s" % cwd)
        if not os.path.isdir(cwd):
            raise ContextError("invalid_cwd", "cwd %s is not a directory" % cwd)
        context = Context(context_id, os.path.normpath(cwd), new_module(self.builtins))
        self.others[context_id] = context
        return context.info()

    def delete(self, context_id):
        if context_id == DEFAULT:
            raise ContextError("context_is_default", "the default context cannot be deleted")
        if self.others.pop(context_id, None) is None:
            raise ContextError("context_not_found", "context %s not found" % context_id)

    def restart(self, context_id):
        """A fresh namespace, the directory it was created with, a count of 0. What the old
        state started (threads, processes, asyncio tasks) lives on."""
        context = self.get(context_id)
        if context is None:
            raise ContextError("context_not_found", "context %s not found" % context_id)
        context.module = new_module(self.builtins)
        context.count = 0
        if context is self.default:
            self.on_default_module(context.module)
            if context.initial_cwd is not None:
                try:
                    os.chdir(context.initial_cwd)
                except OSError:
                    pass
        else:
            context.cwd = context.initial_cwd
        return context.info()

    def enter(self, context):
        """Makes `context` the current one for a cell; returns what leave() needs, or a stderr
        line saying why its directory cannot be entered (then nothing changed)."""
        if context is self.default:
            return None
        try:
            saved = os.getcwd()
        except OSError:
            saved = None
        try:
            os.chdir(context.cwd)
        except OSError as e:
            return "hostd: context %s: cwd %s: %s" % (context.id, context.cwd,
                                                      e.strerror or e)
        sys.modules["__main__"] = context.module
        return _Entered(saved)

    def leave(self, context, entered):
        if context is self.default or entered is None:
            return
        sys.modules["__main__"] = self.default.module
        try:
            context.cwd = os.getcwd()
        except OSError:
            pass                         # the cell deleted it: it stays what it was
        if entered.saved is not None:
            try:
                os.chdir(entered.saved)
            except OSError:
                pass


class _Entered:
    def __init__(self, saved):
        self.saved = saved
