#!/bin/bash
# Builds one template's root filesystem from a build spec into OUT_DIR:
#
#   guest/image/build-rootfs.sh SPEC.json OUT_DIR
#
# SPEC.json is written by src/vm/image/image-builder.ts, which also owns the cache entry (key, lock,
# temporary directory, publish); its debian_dir comes from build-debian.sh. rootfs.py does the
# work, as root in fresh mount and PID namespaces: the mounts it makes for the chroot and any
# process a setup command leaves running die with it, also when it fails or is killed. A builder
# that is not root gets a user namespace with its subordinate ids instead (as mmdebstrap's
# unshare mode), so file owners in the image are still right.
set -euo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# shellcheck source=lib.sh
. "$(dirname "$SELF")/lib.sh"

[[ $# == 2 && -f $1 && -d $2 ]] || die "usage: build-rootfs.sh SPEC.json OUT_DIR"
host_deps_require chroot tar python3 mkfs.erofs
run_isolated python3 "$IMAGE_DIR/rootfs.py" "$1" "$2"
