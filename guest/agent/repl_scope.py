"""An exec's own environment variables and working directory, for its cell only, and changes
of the sandbox's default environment (docs/api.md, "Exec", Python).

The exec's `env` and `cwd` are set before the cell and the previous values of those variables
and the previous working directory put back after it; what the cell changes itself persists,
except those. Default environment changes persist, as if the cell had made them.
"""

import os

from hostd_exec_end import cwd_error


def valid_env(env):
    return env is None or (isinstance(env, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()))


def apply_env_changes(changes):
    """name -> value, or None to unset: into os.environ (hence the environment of processes the
    REPL starts from then on)."""
    for name, value in changes.items():
        try:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        except (TypeError, ValueError):  # not a string, NUL or '=': the agent sends none
            pass


class ExecScope:
    def __init__(self, env, cwd):
        self.env, self.cwd = env or {}, cwd
        self.saved_env = {}             # name -> previous value, or None if unset
        self.saved_cwd = None

    def enter(self):
        """Applies them; returns the stderr line for what cannot be applied (then nothing is),
        else None."""
        if self.cwd is not None:
            try:
                self.saved_cwd = os.getcwd()
            except OSError:             # the cell before deleted it: nowhere to go back to
                self.saved_cwd = None
            try:
                os.chdir(self.cwd)
            except OSError as e:
                return cwd_error(self.cwd, e)
        for name, value in self.env.items():
            self.saved_env.setdefault(name, os.environ.get(name))
            try:
                os.environ[name] = value
            except ValueError as e:
                self.exit()
                return "hostd: env %s: %s" % (name, e)
        return None

    def exit(self):
        apply_env_changes(self.saved_env)
        self.saved_env = {}
        if self.saved_cwd is not None:
            try:
                os.chdir(self.saved_cwd)
            except OSError:             # the cell deleted it: stay where it left us
                pass
            self.saved_cwd = None
