#!/bin/bash
# Makes the empty writable disk of a given size, once per size, and prints its directory:
#
#   guest/image/build-disk.sh SIZE_MIB         -> <cache>/disk/<size>-<key>  (holding disk.qcow2)
#   guest/image/build-disk.sh --dir SIZE_MIB   prints that directory without building it
#
# disk.qcow2 holds an empty ext4 filesystem (the guest's /init makes the overlay's directories
# in it); hostd gives each VM a copy-on-write overlay of it as its second virtio disk, where the guest keeps
# the files it writes (guest/image/init). The raw image is sparse and its zeros become holes in
# the qcow2, so a 4 GiB disk costs a few MB. Fixed UUID, hash seed and times: the same size
# gives the same bytes.
#
# key = this script.
set -euo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# shellcheck source=lib.sh
. "$(dirname "$SELF")/lib.sh"

build() {
	local out=$1 size_mib=$2 seed
	host_deps_require mkfs.ext4 qemu-img
	seed=$(printf 'hostd-disk-%s' "$size_mib" | sha256sum | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/')
	truncate -s "${size_mib}M" "$out/disk.raw"
	# No journal: the disk's contents only matter together with the VM's RAM, which hostd saves
	# at the same paused instant, and journal commits are periodic work in every idle VM.
	# Inode tables are zeroed now (lazy_itable_init=0): otherwise every VM's kernel would zero
	# them in the background after its first mount.
	E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mkfs.ext4 -q -F -L hostd-disk -U "$seed" \
		-O ^has_journal -m 0 -E "hash_seed=$seed,root_owner=0:0,lazy_itable_init=0,nodiscard" \
		"$out/disk.raw"
	qemu-img convert -q -f raw -O qcow2 "$out/disk.raw" "$out/disk.qcow2"
	rm -f "$out/disk.raw"
}

main() {
	local dir_only=
	if [[ ${1:-} == --dir ]]; then
		dir_only=1
		shift
	fi
	[[ $# == 1 && $1 =~ ^[1-9][0-9]*$ ]] || die "usage: build-disk.sh [--dir] SIZE_MIB"
	local out
	out=$CACHE_ROOT/disk/$1-$(key_of_files "build-disk.sh=$SELF")
	if [[ -n $dir_only ]]; then
		echo "$out"
		return
	fi
	cached_build "$out" disk.qcow2 build "$1"
	echo "$out"
}

main "$@"
