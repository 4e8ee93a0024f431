#!/bin/bash
# End-to-end test of templates built from recipes, booted with QEMU the way hostd boots them
# (boot-test.sh), run by `npm test`:
#
#   1. the worked example of docs/templates.md (examples/templates/hello.toml): makes its wheel,
#      builds it, boots it and checks in the guest that its Debian package, its file, its setup
#      command's output and its wheel's module are there, and that /etc/hostd/template.json says
#      what the recipe says;
#   2. the default template python: the data stack imports, the command-line tools and pip are
#      there, and with every module of the recipe's preload list loaded in a process (as the
#      preloaded REPL holds them) at least 900 MiB of guest RAM is still available to user code
#      (the 1 GiB guest of the shorter preload list left it ~780 MiB).
#
#   guest/image/template-test.sh [hello|python]...   (default: both)
#
# Needs the compiled TypeScript (npm run build). Leaves nothing behind but the cache entries.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$(dirname "$here")")
cli=(node "$repo/dist/src/template-cli.js")

say() { echo "template-test: $*" >&2; }

test_hello() {
	python3 "$repo/examples/templates/make-wheel.py" >/dev/null
	local dir
	dir=$(SERVICE_TEMPLATE_DIR=$repo/examples/templates "${cli[@]}" path hello)
	say "hello: built $dir"
	BOOT_TEST_CLONES=1 BOOT_TEST_PROBE='set -e
		command -v figlet
		grep -qx "Hello from a hostd template" /etc/hostd-hello/greeting.txt
		test "$(stat -c %a /etc/hostd-hello/greeting.txt)" = 644
		grep -q _ /etc/hostd-hello/banner.txt
		HELLO_NAME=tester python3 -c "import hostd_hello; print(hostd_hello.greet())" |
			grep -qx "Hello from a hostd template, tester!"
		python3 -c "import json; t = json.load(open(\"/etc/hostd/template.json\")); \
			assert t == {\"name\": \"hello\", \"preload\": [\"hostd_hello\"], \
			\"env\": {\"HELLO_NAME\": \"sandbox\"}}, t"
		echo "hello: package, file, setup command, wheel and template.json are there"' \
		"$here/boot-test.sh" "$dir"
}

test_python() {
	local dir
	dir=$("${cli[@]}" path python)
	say "python: built $dir"
	# The probe imports the whole preload list twice: minutes of TCG on a busy host.
	BOOT_TEST_PROBE_TIMEOUT_S=600 BOOT_TEST_CLONES=1 BOOT_TEST_PROBE='set -e
		python3 -c "import numpy, pandas, matplotlib.pyplot, scipy, sklearn, sympy, statsmodels, \
			networkx, PIL, requests, bs4, lxml, openpyxl, yaml, tabulate"
		python3 -c "import json; t = json.load(open(\"/etc/hostd/template.json\")); \
			assert t[\"env\"] == {\"MPLBACKEND\": \"Agg\"} and \
			t[\"preload\"] == [\"numpy\", \"pandas\", \"matplotlib.pyplot\", \"scipy.stats\", \
			\"scipy.optimize\", \"sklearn.linear_model\", \"sklearn.model_selection\", \"sympy\", \
			\"networkx\", \"PIL.Image\", \"requests\", \"bs4\", \"lxml.etree\", \"openpyxl\", \
			\"yaml\"], t"
		for c in git curl wget unzip sqlite3 jq pip; do command -v $c >/dev/null; done
		test ! -e /usr/lib/python3.11/EXTERNALLY-MANAGED
		python3 -c "import importlib, json, time
for m in json.load(open(\"/etc/hostd/template.json\"))[\"preload\"]: importlib.import_module(m)
open(\"/tmp/loaded\", \"w\"); time.sleep(600)" &
		loader=$!  # saved now: the process substitution below sets $! to its own pid
		while [ ! -e /tmp/loaded ]; do sleep 0.2; done
		free -m
		read -r _ total _ _ _ _ available < <(free -m | sed -n 2p)
		echo "python: $available of $total MiB available ($((available * 100 / total))%) with the data stack loaded"
		kill "$loader"
		test "$available" -ge 900' \
		"$here/boot-test.sh" "$dir"
}

[[ $# -gt 0 ]] || set -- hello python
for t in "$@"; do
	"test_$t"
	say "$t: ok"
done
