"""The Python package of the worked example template (examples/templates/hello.toml)."""

import os

__version__ = "1.0.0"


def greet():
    """The greeting the template's file holds, addressed to $HELLO_NAME (the template's env)."""
    with open("/etc/hostd-hello/greeting.txt") as f:
        greeting = f.read().strip()
    return f"{greeting}, {os.environ.get('HELLO_NAME', 'stranger')}!"
