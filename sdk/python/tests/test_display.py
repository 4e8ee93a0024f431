"""Rich outputs: ``display`` events reach exec's iterator in order with the output lines, and
run() decodes them into ``displays`` (images as bytes, text types as strings, the raw bundle
kept) and hands each to ``on_display`` as it arrives."""

import base64
import unittest

from _support import SANDBOX_ID, FakeHostd

from hostd import Display, Sandbox, resolve_config, to_display

PNG = bytes([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 1, 2, 255])
FIGURE = {"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure size 640x480>"}
TABLE = {"text/html": "<table></table>", "text/plain": "   a\n0  1"}


def handler(req, res):
    res.start_stream()
    res.event("stdout", "before", 0)
    res.event("display", FIGURE, 1)
    res.event("display", TABLE, 2)
    res.event("exit", 0, 3)
    res.end_stream()


class DisplayTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeHostd(handler)
        self.addCleanup(self.fake.close)
        self.sandbox = Sandbox(SANDBOX_ID, resolve_config(base_url=self.fake.url))

    def test_exec_yields_display_events_with_their_bundles_in_order(self):
        events = list(self.sandbox.exec("plt.show()", display=True))
        self.assertEqual([(e.type, e.seq) for e in events], [("stdout", 0), ("display", 1), ("display", 2), ("exit", 3)])
        self.assertEqual(events[1].data, FIGURE)
        self.assertEqual(self.fake.requests[-1].json(), {"code": "plt.show()", "language": "python", "display": True})

    def test_run_collects_decoded_displays_and_calls_on_display(self):
        seen = []
        result = self.sandbox.run("x", display=True, on_display=seen.append)
        self.assertEqual(result.stdout, "before\n")
        figure, table = result.displays
        self.assertEqual((figure.png, figure.text, figure.data), (PNG, "<Figure size 640x480>", FIGURE))
        self.assertEqual((table.html, table.png), ("<table></table>", None))
        self.assertEqual(seen, result.displays)


class ToDisplayTest(unittest.TestCase):
    def test_names_the_common_mime_types_and_keeps_the_rest_in_data(self):
        bundle = {
            "text/plain": "x",
            "text/markdown": "# x",
            "text/latex": "$x$",
            "image/svg+xml": "<svg/>",
            "image/jpeg": base64.b64encode(b"jpeg").decode(),
            "application/json": {"a": [1, 2]},
            "application/vnd.custom": "kept",
        }
        self.assertEqual(
            to_display(bundle),
            Display(data=bundle, text="x", markdown="# x", latex="$x$", svg="<svg/>", jpeg=b"jpeg", json={"a": [1, 2]}),
        )

    def test_leaves_a_value_of_the_wrong_kind_in_data_only(self):
        d = to_display({"text/plain": "x", "image/png": 42})
        self.assertIsNone(d.png)
        self.assertEqual(d.data["image/png"], 42)


if __name__ == "__main__":
    unittest.main()
