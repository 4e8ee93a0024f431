# Sourced by the setup scripts: reads scripts/host-packages, the one declared list of the host
# commands hostd's scripts need and the Debian package of each.
#
#   host_deps_missing [COMMAND...]   prints the packages of the listed commands (all when none
#                                    are given) that are not on PATH, one per line, sorted
#   host_deps_commands [MODE]        the declared commands; for any MODE but test, without
#                                    those marked "tests only:" (only npm test needs them),
#                                    for MODE start, without those marked "cluster:" (npm test,
#                                    npm run cluster and npm run bench need them), and for any
#                                    MODE but bench, without those marked "bench only:"
#                                    (Python modules for the bench's native counterparts)
#   host_deps_require COMMAND...     exits with a message naming the package of each missing one
HOST_DEPS_FILE=${HOST_DEPS_FILE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/host-packages}

host_deps_package() {
	awk -v c="$1" '!/^#/ && $1 == c { print $2; exit }' "$HOST_DEPS_FILE"
}

host_deps_commands() {
	awk -v mode="${1:-test}" '!/^#/ && NF >= 2 {
		if (mode != "test" && $3 == "tests" && $4 == "only:") next
		if (mode == "start" && $3 == "cluster:") next
		if (mode != "bench" && $3 == "bench" && $4 == "only:") next
		print $1
	}' "$HOST_DEPS_FILE"
}

host_deps_missing() {
	local cmd pkg
	local -a cmds=("$@")
	if [ "${#cmds[@]}" -eq 0 ]; then
		mapfile -t cmds < <(host_deps_commands)
	fi
	for cmd in "${cmds[@]}"; do
		case $cmd in
		python3:*) /usr/bin/python3 -c "import ${cmd#python3:}" >/dev/null 2>&1 && continue ;;
		*) command -v "$cmd" >/dev/null 2>&1 && continue ;;
		esac
		pkg=$(host_deps_package "$cmd")
		if [ -z "$pkg" ]; then
			echo "host-deps: $cmd is not declared in $HOST_DEPS_FILE" >&2
			return 2
		fi
		echo "$pkg"
	done | sort -u
}

host_deps_require() {
	local missing
	missing=$(host_deps_missing "$@") || exit 2
	[ -z "$missing" ] && return 0
	echo "missing commands; install the Debian packages: $(echo "$missing" | tr '\n' ' ')" >&2
	echo "  (scripts/run.sh, behind npm start and npm test, installs them when run as root)" >&2
	exit 1
}
