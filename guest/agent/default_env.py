"""The sandbox's default environment: what every bash exec starts from, and what the REPL's
os.environ holds (guest/PROTOCOL.md, "Environment").

One place, in layers, each over the ones before:
  base      HOME, LANG, PATH
  template  the template's `env` (/etc/hostd/template.json)
  services  what guest services add at start-up, e.g. net_relay.PROXY_ENV: merge() it in
            main(), before the agent starts (the first REPL worker starts with it)
  sandbox   the sandbox's own `env`, from hostd's set_env (the create request's `env`)
An exec's own `env` goes over all of them, for that exec only.
"""

import threading

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DefaultEnvironment:
    def __init__(self, home, template_env=None):
        self._lock = threading.Lock()
        self._base = {"HOME": home, "LANG": "C.UTF-8", "PATH": PATH}
        self._template = dict(template_env or {})
        self._services = {}
        self._sandbox = {}
        self._current = self._compose()

    def current(self):
        """The environment as a dict, not to be modified: one is made per change, so a reader
        in another thread never sees one half-changed."""
        return self._current

    def merge(self, variables):
        """Adds a guest service's variables (HTTP_PROXY, ...)."""
        with self._lock:
            self._services.update(variables)
            self._current = self._compose()

    def set_sandbox(self, variables):
        """Replaces the sandbox's own variables. Returns what changed in the whole
        environment: ({name: value} set, [names] unset), for the running REPL."""
        with self._lock:
            before = self._current
            self._sandbox = dict(variables)
            after = self._current = self._compose()
        return diff(before, after)

    def _compose(self):
        env = dict(self._base)
        for layer in (self._template, self._services, self._sandbox):
            env.update(layer)
        return env


def diff(before, after):
    """What turns environment `before` into `after`: ({name: value} to set, [names] to unset)."""
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    return changed, [k for k in before if k not in after]


def invalid_entry(variables):
    """Why `variables` cannot be an environment (a name that is empty or holds '=' or NUL, a
    value that holds NUL, or not strings), or None: a process cannot be started with it."""
    for name, value in variables.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            return "invalid variable name %r" % (name,)
        if not isinstance(value, str) or "\0" in value:
            return "invalid value of %s" % name
    return None
