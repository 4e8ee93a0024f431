#!/usr/bin/env python3
"""Data in and out with the Python SDK: a CSV uploaded, pandas and a matplotlib chart in the
sandbox, the chart back as PNG bytes, and one allow-listed request to a server on this host.
Reads SERVICE_HOSTD_URL and SERVICE_API_KEY; exits non-zero on failure. CI runs it.

    python3 examples/data-in-out.py
"""

import http.server
import os
import sys
import threading

try:
    from hostd import Sandbox
except ImportError:  # not installed: use this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
    from hostd import Sandbox


class Prices(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"eur_per_usd": 0.92}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prices)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
try:
    # Network is off unless allowed: here only this host's port, as host.hostd.internal.
    with Sandbox.create(allow_out=["host.hostd.internal:%d" % port]) as sbx:
        sbx.files.write("/root/sales.csv", "month,usd\njan,100\nfeb,140\nmar,125\n")
        table = sbx.run(
            "import json, urllib.request\n"
            "import pandas as pd\n"
            "import matplotlib.pyplot as plt\n"
            'rate = json.load(urllib.request.urlopen("http://host.hostd.internal:%d/"))["eur_per_usd"]\n'
            'df = pd.read_csv("/root/sales.csv")\n'
            'df["eur"] = df["usd"] * rate\n'
            'df.plot(x="month", y="eur", kind="bar")\n'
            "plt.show()\n"
            'print(df["eur"].sum())' % port,
            display=True,
        )
        assert table.exit_code == 0, (table.exit_code, table.stdout, table.stderr)
        assert table.stdout == "335.8\n", table.stdout
        png = table.displays[0].png
        assert png.startswith(b"\x89PNG"), "a PNG chart came back"
        print("total in EUR:", table.stdout.strip(), "- chart:", len(png), "bytes of PNG")
finally:
    server.shutdown()
print("data-in-out ok")
