"""Rich outputs (docs/api.md, "Rich outputs"): `display` messages of execs with display on.

matplotlib and pandas are stand-ins (fakes/): the worker must work with whatever the user
imported, and import neither itself.
"""

import base64
import hashlib
import unittest

from agent_harness import FAKES, AgentTestCase

RICH = """class Rich:
    def _repr_html_(self):
        return '<b>rich</b>'
    def _repr_png_(self):
        return b'\\x89PNG bytes'
    def _repr_json_(self):
        return {'a': [1, 2]}
    def _repr_svg_(self):
        return '<svg/>'
    def _repr_markdown_(self):
        return '**rich**'
    def _repr_latex_(self):
        return '$x$'
    def __repr__(self):
        return 'Rich()'
"""
USE_FAKES = "import sys\nsys.path.insert(0, %r)\n" % FAKES


def b64(data):
    return base64.b64encode(data).decode()


class RichOutputs(AgentTestCase):
    def run_display(self, code):
        return self.run_ok(code, display=True)

    def test_without_display_nothing_changes(self):
        result = self.run_ok(RICH + "display(Rich(), 2)\nRich()")
        self.assertEqual(result.stdout, ["Rich()", "2", "Rich()"])
        self.assertEqual(result.displays, [])

    def test_a_last_value_with_rich_representations_is_one_display_bundle(self):
        result = self.run_display(RICH + "Rich()")
        self.assertEqual(result.stdout, [])
        self.assertEqual(result.displays, [{
            "text/html": "<b>rich</b>", "image/png": b64(b"\x89PNG bytes"),
            "application/json": {"a": [1, 2]}, "image/svg+xml": "<svg/>",
            "text/markdown": "**rich**", "text/latex": "$x$", "text/plain": "Rich()"}])
        self.assertEqual(self.run_display("_").displays[0]["text/plain"], "Rich()")

    def test_a_plain_last_value_still_prints_its_repr(self):
        result = self.run_display("x = 41\nx + 1")
        self.assertEqual((result.stdout, result.displays), (["42"], []))

    def test_display_sends_one_bundle_per_object_in_order_with_the_output(self):
        result = self.run_display(RICH + "print('before', end='')\ndisplay(1, Rich())\n"
                                  "print('after')")
        self.assertEqual([(m["op"], m["data"] if m["op"] == "out" else m["data"]["text/plain"])
                          for m in result.events],
                         [("out", "before"), ("display", "1"), ("display", "Rich()"),
                          ("out", "after")])

    def test_display_raw_sends_a_bundle_as_it_is(self):
        result = self.run_display("display({'text/html': '<i>x</i>', 'image/png': b'PNG'}, "
                                  "raw=True)")
        self.assertEqual(result.displays[0]["text/html"], "<i>x</i>")
        self.assertEqual(result.displays[0]["image/png"], b64(b"PNG"))
        self.assertIn("text/plain", result.displays[0])

    def test_a_representation_that_fails_is_left_out(self):
        result = self.run_display("class Half:\n    def _repr_html_(self):\n"
                                  "        raise ValueError('no html')\n"
                                  "    def _repr_markdown_(self):\n        return '*md*'\n"
                                  "Half()")
        self.assertEqual(sorted(result.displays[0]), ["text/markdown", "text/plain"])
        result = self.run_display("class Broken:\n    def _repr_html_(self):\n"
                                  "        raise ValueError('no html')\n"
                                  "    def __repr__(self):\n        return 'Broken()'\n"
                                  "Broken()")
        self.assertEqual((result.stdout, result.displays), (["Broken()"], []))

    def test_an_object_that_answers_every_attribute_has_no_rich_representation(self):
        result = self.run_display("class Anything:\n    def __getattr__(self, name):\n"
                                  "        return lambda *a: '<b>x</b>'\n"
                                  "    def __repr__(self):\n        return 'Anything()'\n"
                                  "Anything()")
        self.assertEqual((result.stdout, result.displays), (["Anything()"], []))

    def test_figures_shown_with_plt_show_are_displayed_and_closed(self):
        result = self.run_display(USE_FAKES + "import matplotlib, matplotlib.pyplot as plt\n"
                                  "fig, ax = plt.subplots()\nprint('drawn')\nplt.show()\n"
                                  "plt.get_fignums(), matplotlib.native_shows")
        self.assertEqual(result.stdout, ["drawn", "([], [])"])
        self.assertEqual(result.displays, [{
            "image/png": b64(b"PNG of figure 1 as png"),
            "text/plain": "<Figure size 640x480 with 1 Axes>"}])

    def test_without_display_plt_show_is_matplotlibs_own(self):
        result = self.run_ok(USE_FAKES + "import matplotlib, matplotlib.pyplot as plt\n"
                             "fig, ax = plt.subplots()\nplt.show()\nmatplotlib.native_shows")
        self.assertEqual((result.stdout, result.displays), (["[[1]]"], []))

    def test_a_figure_or_axes_as_the_last_value_is_displayed(self):
        self.run_ok(USE_FAKES + "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()")
        result = self.run_display("fig")
        self.assertEqual(result.displays, [{
            "image/png": b64(b"PNG of figure 1 as png"),
            "text/plain": "<Figure size 640x480 with 1 Axes>"}])
        self.run_ok("fig2, ax2 = plt.subplots()")
        result = self.run_display("ax2")
        self.assertEqual(result.displays, [{
            "image/png": b64(b"PNG of figure 2 as png"), "text/plain": "<Axes: >"}])
        self.assertEqual(self.run_ok("plt.get_fignums()").stdout, ["[]"])
        self.assertEqual(self.run_ok("fig").stdout, ["<Figure size 640x480 with 1 Axes>"])

    def test_pandas_frames_and_series_are_html_tables(self):
        self.run_ok(USE_FAKES + "import pandas as pd")
        result = self.run_display("pd.DataFrame([[1, 2]])")
        self.assertEqual(result.displays, [{"text/html": "<table><tr><td>1</td><td>2</td></tr>"
                                                         "</table>", "text/plain": "1 2"}])
        result = self.run_display("pd.Series([3, 4])")
        self.assertEqual(result.displays, [{"text/html": "<table><tr><td>3</td></tr><tr><td>4"
                                                         "</td></tr></table>",
                                            "text/plain": "3\n4"}])

    def test_matplotlib_and_pandas_are_never_imported_for_the_user(self):
        result = self.run_display(USE_FAKES + RICH + "display(Rich(), 1)\nRich()")
        self.assertEqual(len(result.displays), 3)
        self.assertEqual(self.run_ok("'matplotlib' in sys.modules, 'pandas' in sys.modules")
                         .stdout, ["(False, False)"])

    def test_a_bundle_larger_than_the_outbox_arrives_whole(self):
        result = self.run_display(
            "import hashlib, os\ndata = os.urandom(3 << 20)\n"
            "class Big:\n    def _repr_png_(self):\n        return data\n"
            "print(hashlib.sha256(data).hexdigest())\nBig()")
        digest = hashlib.sha256(base64.b64decode(result.displays[0]["image/png"])).hexdigest()
        self.assertEqual(result.stdout, [digest])

    def test_a_bundle_over_the_line_limit_is_sent_as_text_only_with_a_note(self):
        result = self.agent.run(
            "class Huge:\n    def _repr_png_(self):\n        return bytes(13 << 20)\n"
            "    def __repr__(self):\n        return 'Huge()'\nHuge()", display=True)
        self.assertEqual((result.code, result.displays), (0, [{"text/plain": "Huge()"}]))
        self.assertEqual(len(result.stderr), 1)
        self.assertEqual(self.run_ok("print('next')").stdout, ["next"])


if __name__ == "__main__":
    unittest.main()
