"""The asyncio classes mirror the blocking ones method for method: same names, same
parameters (names, kinds, defaults), classmethods where the blocking twin has them, and every
method awaitable. (The TypeScript SDK is compared with this one by
sdk/typescript/test/parity.test.ts, which reads both.)"""

import inspect
import unittest

import hostd
from hostd import AsyncFiles, AsyncSandbox, AsyncSnapshot, AsyncTemplate, Files, Sandbox, Snapshot, Template

PAIRS = [(Sandbox, AsyncSandbox), (Files, AsyncFiles), (Snapshot, AsyncSnapshot), (Template, AsyncTemplate)]
#: Dunder methods that have an asyncio counterpart under another name.
RENAMED = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
LANGUAGE_ONLY = {"__init__", "__repr__", "__str__"}


def methods(cls):
    out = {}
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in RENAMED and name not in RENAMED.values():
            continue
        if isinstance(value, (classmethod, staticmethod)) or inspect.isfunction(value):
            out[name] = value
    return out


def signature(value):
    function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    return [
        (p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values() if p.name not in ("self", "cls")
    ]


class ParityTest(unittest.TestCase):
    def test_every_blocking_method_has_an_async_twin_with_the_same_parameters(self):
        for blocking, asynchronous in PAIRS:
            sync_methods = methods(blocking)
            async_methods = methods(asynchronous)
            expected = {RENAMED.get(n, n) for n in sync_methods} - LANGUAGE_ONLY
            self.assertEqual(set(async_methods) - LANGUAGE_ONLY, expected, asynchronous.__name__)
            for name, value in sync_methods.items():
                twin = async_methods[RENAMED.get(name, name)]
                with self.subTest(cls=blocking.__name__, method=name):
                    self.assertEqual(isinstance(value, classmethod), isinstance(twin, classmethod))
                    self.assertEqual(signature(value), signature(twin))

    def test_every_async_method_is_awaitable_or_async_iterable(self):
        for _, asynchronous in PAIRS:
            for name, value in methods(asynchronous).items():
                function = value.__func__ if isinstance(value, classmethod) else value
                with self.subTest(cls=asynchronous.__name__, method=name):
                    if name == "create":
                        continue  # returns an object that is both awaitable and an async context manager
                    self.assertTrue(
                        inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function), name
                    )

    def test_every_public_name_is_exported(self):
        for name in hostd.__all__:
            self.assertTrue(hasattr(hostd, name), name)


if __name__ == "__main__":
    unittest.main()
