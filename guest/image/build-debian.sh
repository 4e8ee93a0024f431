#!/bin/bash
# Installs Debian bookworm packages into a root filesystem tarball, once per package list, and
# prints the directory it is in:
#
#   guest/image/build-debian.sh PACKAGE...   -> <cache>/debian/<key>
#
#   rootfs.tar     the Essential set, ./base-packages and PACKAGE..., installed and configured
#                  by mmdebstrap (no docs, man pages or locales; no apt)
#   packages.lock  every installed package as name=version, sorted
#
# key = this script, ./base-packages and the sorted package list. This is the slow part of a
# template build (downloading and unpacking), so build-rootfs.sh starts from this tarball: a
# recipe change that keeps the package list (files, setup commands, Python packages) does not
# install anything again. Downloaded .deb files also go to <cache>/debs, which every later
# build reads first, so a changed list downloads only what is new.
set -euo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# shellcheck source=lib.sh
. "$(dirname "$SELF")/lib.sh"

package_list() {
	{
		sed -e 's/#.*//' -e 's/[[:space:]]//g' "$IMAGE_DIR/base-packages"
		printf '%s\n' "$@"
	} | grep -v '^$' | sort -u
}

build() {
	local out=$1
	shift
	local pool=$CACHE_ROOT/debs packages lock_fd
	packages=$(package_list "$@" | paste -sd,)
	host_deps_require mmdebstrap apt-get dpkg-deb zstd
	log "installing $packages"
	mkdir -p "$pool"
	# One writer of the shared .deb pool at a time.
	exec {lock_fd}>"$pool.lock"
	flock "$lock_fd"
	# essential/unlink and cleanup/apt are skipped so that every .deb stays in the chroot's apt
	# cache for sync-out; the customize hook then removes apt's state (apt is not installed).
	# py3compile is a no-op while packages install: build-rootfs.sh byte-compiles every Python
	# tree anyway (with hashes instead of timestamps), so what it wrote (235 MB of the python
	# template's 1.4 GB tarball) was only stored, unpacked and overwritten.
	# force-unsafe-io: no fsync for the files of a tree that is thrown away.
	# shellcheck disable=SC2016 # $1 expands in mmdebstrap's hook shell
	run_mmdebstrap --variant=essential --format=tar \
		--include="$packages" \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--dpkgopt=force-unsafe-io \
		--essential-hook='chroot "$1" dpkg-divert --quiet --local --rename --divert /usr/bin/py3compile.hostd --add /usr/bin/py3compile' \
		--essential-hook='printf "#!/bin/sh\nexit 0\n" >"$1/usr/bin/py3compile" && chmod 0755 "$1/usr/bin/py3compile"' \
		--customize-hook='rm "$1/usr/bin/py3compile" && chroot "$1" dpkg-divert --quiet --local --rename --remove /usr/bin/py3compile' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/lintian/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--skip=essential/unlink,cleanup/apt,cleanup/mmdebstrap \
		--setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
		--setup-hook="sync-in $pool /var/cache/apt/archives/" \
		--customize-hook="sync-out /var/cache/apt/archives $pool" \
		--customize-hook='dpkg-query --admindir="$1/var/lib/dpkg" -W -f "\${Package}=\${Version}\n" | sort >"$1/packages.lock"' \
		--customize-hook="download /packages.lock $out/packages.lock" \
		--customize-hook='rm -rf "$1/packages.lock" "$1/etc/apt" "$1/var/lib/apt" "$1/var/cache/apt"' \
		"$SUITE" "$out/rootfs.tar" "${SOURCES[@]}" >&2
	rm -rf "$pool/partial" "$pool/lock"
	exec {lock_fd}>&-
}

main() {
	[[ $# -gt 0 ]] || set -- # the base packages alone make python-slim
	local key
	key=$({
		key_of_files "build-debian.sh=$SELF" "base-packages=$IMAGE_DIR/base-packages"
		package_list "$@"
	} | sha256sum | cut -c1-16)
	cached_build "$CACHE_ROOT/debian/$key" packages.lock build "$@"
	echo "$CACHE_ROOT/debian/$key"
}

main "$@"
