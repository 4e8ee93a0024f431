# Sourced by the image build scripts of guest/image: what they share (Debian source, fixed
# timestamps, cache layout, logging, keys, one-builder-per-key locking, atomic publish).
#
# Environment (all optional):
#   SERVICE_CACHE_DIR              cache root (default /var/cache/hostd for root, else ~/.cache/hostd)
#   HOSTD_DEBIAN_MIRROR            Debian mirror (default http://deb.debian.org/debian)
#   HOSTD_DEBIAN_SECURITY_MIRROR   security mirror (default http://deb.debian.org/debian-security)
#   HOSTD_MMDEBSTRAP_MODE          mmdebstrap --mode (default: root if root, else unshare)
# shellcheck shell=bash

IMAGE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$(dirname "$IMAGE_DIR")")
if [[ -n ${SERVICE_CACHE_DIR:-} ]]; then
	CACHE_ROOT=$SERVICE_CACHE_DIR
elif [[ $(id -u) == 0 ]]; then
	CACHE_ROOT=/var/cache/hostd
else
	CACHE_ROOT=$HOME/.cache/hostd
fi
MIRROR=${HOSTD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${HOSTD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
# Every template is bookworm, so every guest runs this Python; the boot image byte-compiles the
# agent for it when the host's Python is the same version.
GUEST_PYTHON=3.11
# Fixed file times, so the same inputs give the same bytes (mmdebstrap, cpio, mkfs.erofs and
# mke2fs all honour it).
export SOURCE_DATE_EPOCH=1704067200
export LC_ALL=C
umask 022

# shellcheck source=../../scripts/lib/host-deps.sh
. "$REPO_DIR/scripts/lib/host-deps.sh"

log() { echo "${0##*/}: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}
# A line the TypeScript builder reads to name the step that failed (src/vm/image/image-builder.ts).
step() { echo "hostd-build-step: $*" >&2; }

# mmdebstrap's MIRROR arguments: bookworm with its updates and security fixes.
SOURCES=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main"
	"deb $SECURITY_MIRROR $SUITE-security main")

# key LABEL=FILE...: the first 16 hex digits of a sha256 over each label and its file's content,
# so renaming a file in the repository does not change a key but editing one does.
key_of_files() {
	local arg
	for arg in "$@"; do
		printf '%s %s\n' "${arg%%=*}" "$(sha256sum <"${arg#*=}" | cut -d' ' -f1)"
	done | sha256sum | cut -c1-16
}

# cached_build DIR MARKER FUNCTION ARGS...: unless DIR/MARKER exists, takes the lock of DIR,
# runs FUNCTION TMP ARGS... in a fresh temporary directory next to DIR and renames TMP to DIR,
# so a reader never sees half an artifact and two builders of one key never race. The temporary
# directory goes away on failure and on a signal. Prints nothing.
cached_build() {
	local out=$1 marker=$2 fn=$3
	shift 3
	[[ -e $out/$marker ]] && return 0
	mkdir -p "$(dirname "$out")"
	local lock_fd
	exec {lock_fd}>"$out.lock"
	flock "$lock_fd"
	if [[ -e $out/$marker ]]; then
		exec {lock_fd}>&-
		return 0
	fi
	# An incomplete artifact of an older script, and what a builder that was killed left.
	rm -rf "$out" "$out".tmp.*
	CACHED_BUILD_TMP=$(mktemp -d "$out.tmp.XXXXXX")
	chmod 0755 "$CACHED_BUILD_TMP" # QEMU runs as another account that must read the files
	# --one-file-system: never into a mount a killed command might have left behind.
	trap 'rm -rf --one-file-system "$CACHED_BUILD_TMP"' EXIT
	trap 'if [[ -n ${CHILD_PID:-} ]]; then kill "$CHILD_PID" 2>/dev/null; wait "$CHILD_PID"; fi; exit 130' INT TERM HUP
	"$fn" "$CACHED_BUILD_TMP" "$@"
	mv -T "$CACHED_BUILD_TMP" "$out"
	trap - EXIT INT TERM HUP
	exec {lock_fd}>&-
}

# run_bg COMMAND...: runs a long command in the background and waits for it, so that a signal
# reaches cached_build's trap at once instead of after the command is done.
run_bg() {
	"$@" &
	CHILD_PID=$!
	wait "$CHILD_PID"
	CHILD_PID=
}

# run_isolated COMMAND...: run_bg, in fresh mount and PID namespaces, so that the mounts COMMAND
# makes and every process it starts end with it, also when it fails or is killed: a program's
# own clean-up on SIGTERM is not enough (mmdebstrap, stopped while it installs packages, leaves
# its chroot's /proc, /sys and /dev mounts behind). On SIGTERM, the shell between unshare and
# COMMAND kills COMMAND, the first process of the PID namespace, with SIGKILL (a first process
# gets no signal it has no handler for), and the kernel then kills the rest of the namespace.
# A builder that is not root gets a user namespace with its subordinate ids instead (as
# mmdebstrap's unshare mode), so file owners are still right.
run_isolated() {
	local as_root=() propagation=private
	host_deps_require unshare
	if [[ $(id -u) != 0 ]]; then
		host_deps_require newuidmap
		as_root=(--map-root-user --map-auto)
	fi
	if ! unshare "${as_root[@]}" --mount --propagation private true 2>/dev/null; then
		# In a chroot, / is not a mount point and cannot be made private (EINVAL). The mounts
		# then stay in the namespace only if no mount here is shared with another namespace.
		if grep -q ' shared:' /proc/self/mountinfo; then
			die "cannot make mounts private in this chroot, and some are shared: run the build outside the chroot, or make them private (mount --make-rprivate)"
		fi
		propagation=unchanged
	fi
	# shellcheck disable=SC2016 # expands in the shell inside the namespaces
	run_bg unshare "${as_root[@]}" --mount --propagation "$propagation" --pid bash -c '
		trap '\''kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 143'\'' TERM INT HUP
		"$@" &
		pid=$!
		wait "$pid"' run_isolated "$@"
}

# run_mmdebstrap ARGS...: mmdebstrap under run_bg, leaving nothing behind when it is killed. As
# root it runs isolated (run_isolated), its chroot in cached_build's temporary directory so that
# what it leaves goes with that; otherwise its unshare mode makes its own namespaces.
run_mmdebstrap() {
	if [[ $(id -u) == 0 ]]; then
		local tmp=$CACHED_BUILD_TMP/mmdebstrap
		mkdir "$tmp"
		run_isolated env TMPDIR="$tmp" mmdebstrap --mode="${HOSTD_MMDEBSTRAP_MODE:-root}" "$@"
		rmdir "$tmp"
	else
		run_bg mmdebstrap --mode="${HOSTD_MMDEBSTRAP_MODE:-unshare}" "$@"
	fi
}
