"""The template's own settings, from a file its root filesystem holds:

    /etc/hostd/template.json
    {"name": "python", "preload": ["numpy", "pandas", "matplotlib.pyplot"],
     "env": {"MPLBACKEND": "Agg"}}

`preload`: modules the REPL worker imports before it says it is ready (so before the template
is frozen: every sandbox has them in sys.modules for free). `env`: part of the sandbox's
default environment. A missing or broken file means an empty template: the agent must run
whatever the image holds.
"""

import json

DEFAULT_PATH = "/etc/hostd/template.json"


class Template:
    def __init__(self, name="", preload=(), env=None):
        self.name, self.preload, self.env = name, list(preload), dict(env or {})


def load_template(path, log):
    """The template described by the file at path; an empty one (logged) if it is missing or
    not as above. Entries of the wrong type are dropped one by one."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        log("no %s: nothing to preload" % path)
        return Template()
    except (OSError, ValueError) as e:
        log("cannot read %s: %s; nothing to preload" % (path, e))
        return Template()
    if not isinstance(data, dict):
        log("%s is not a JSON object; nothing to preload" % path)
        return Template()
    name = data.get("name") if isinstance(data.get("name"), str) else ""
    preload = data.get("preload") if isinstance(data.get("preload"), list) else []
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    good_preload = [m for m in preload if isinstance(m, str) and m]
    good_env = {k: v for k, v in env.items() if _valid_name(k) and isinstance(v, str)
                and "\0" not in v}
    if len(good_preload) != len(preload) or len(good_env) != len(env):
        log("%s: ignored preload entries that are not module names, or env entries that are "
            "not NAME: string" % path)
    return Template(name, good_preload, good_env)


def _valid_name(name):
    return (isinstance(name, str) and name != "" and "=" not in name and "\0" not in name)
