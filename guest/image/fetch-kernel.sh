#!/bin/bash
# Fetches what the boot image takes from Debian, once, into the cache, and prints its directory:
#
#   guest/image/fetch-kernel.sh         -> <cache>/kernel/<key>
#   guest/image/fetch-kernel.sh --dir   prints that directory without fetching anything
#
#   vmlinux        uncompressed ELF kernel (PVH entry; boots with -kernel on microvm), extracted
#                  from the lz4 payload of linux-image-cloud-amd64's vmlinuz
#   modules/       the drivers the guest loads at boot and their dependencies, skipping built-ins
#   modules.order  their file names in load order (virtio_ring before virtio, ...)
#   busybox        busybox-static: /init's shell and the sandbox's PID 1
#   release.json   kernel version and the Debian package versions
#
# key = this script only: the kernel is fetched once and reused until the script changes, so an
# agent or init change (build-boot.sh) never downloads the kernel again.
set -euo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# shellcheck source=lib.sh
. "$(dirname "$SELF")/lib.sh"

KERNEL_METAPACKAGE=linux-image-cloud-amd64
# virtio_mmio: microvm's devices; virtio_console: the agent's ports; virtio_blk, erofs, overlay:
# the root filesystem (ext4 for the writable disk is built into this kernel).
MODULES=(virtio_mmio virtio_console virtio_blk erofs overlay ext4)

# Runs in mmdebstrap's customize hook, outside the (empty) chroot but with its apt set-up: fetches
# the versioned kernel package the metapackage points at, and busybox-static.
download() {
	local dir=$1/tmp/hostd-kernel kpkg
	mkdir -p "$dir"
	export APT_CONFIG=$MMDEBSTRAP_APT_CONFIG
	kpkg=$(apt-cache depends "$KERNEL_METAPACKAGE" |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
	[[ -n $kpkg ]] || die "cannot resolve $KERNEL_METAPACKAGE"
	log "kernel package $kpkg"
	(cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" busybox-static >&2)
}

# Like the kernel's scripts/extract-vmlinux: find the lz4 (legacy frame) magic in the bzImage and
# decompress from there until the output is an ELF file. lz4 exits non-zero on the bytes that
# follow the payload, so the result is judged by its ELF magic, not by the exit status.
extract_vmlinux() {
	local img=$1 out=$2 off
	local pvh='Unknown note type: \(0x00000012\)'
	for off in $(grep -obUaP '\x02\x21\x4c\x18' "$img" | cut -d: -f1); do
		tail -c "+$((off + 1))" "$img" | lz4 -dc >"$out" 2>/dev/null || true
		if [[ $(head -c 4 "$out" | od -An -c | tr -d ' ') == '177ELF' ]]; then
			# microvm enters the uncompressed kernel through its PVH entry point note
			# (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12); check it when binutils is there.
			if command -v readelf >/dev/null &&
				! readelf -n "$out" | grep -qE "Xen[[:space:]]+0x[0-9a-f]+[[:space:]]+($pvh|.*PHYS32)"; then
				die "$img has no PVH entry note: microvm cannot boot it"
			fi
			return 0
		fi
	done
	die "no lz4-compressed ELF in $img"
}

# Copies the wanted modules and their dependencies (depth first, so dependencies load first).
select_modules() {
	local moddir=$1 out=$2
	local -A seen=()
	local -a order=()
	visit() {
		local name=$1 ko dep
		[[ -z ${seen[$name]:-} ]] || return 0
		seen[$name]=1
		# modules.builtin lists paths with either - or _ in file names.
		if grep -qE "/${name//_/[-_]}\.ko\$" "$moddir/modules.builtin"; then
			log "module $name is built in"
			return 0
		fi
		ko=$(find "$moddir/kernel" -name "${name//_/[-_]}.ko" -print -quit)
		[[ -n $ko ]] || die "module $name not in the kernel package"
		for dep in $(modinfo -F depends "$ko" | tr , ' '); do
			visit "$dep"
		done
		order+=("$ko")
	}
	local m
	for m in "${MODULES[@]}"; do visit "$m"; done
	mkdir -p "$out/modules"
	for m in "${order[@]}"; do
		install -m 0644 "$m" "$out/modules/"
		basename "$m" >>"$out/modules.order"
	done
	log "modules in load order: $(paste -sd' ' "$out/modules.order")"
}

fetch() {
	local out=$1 work=$1/work
	mkdir -p "$work/debs"
	host_deps_require mmdebstrap apt-get dpkg-deb lz4 modinfo python3
	# shellcheck disable=SC2016 # $1 expands in mmdebstrap's hook shell
	run_mmdebstrap --variant=custom --format=null \
		--customize-hook='"$HOSTD_FETCH_SELF" __download "$1"' \
		--customize-hook="sync-out /tmp/hostd-kernel $work/debs" \
		"$SUITE" /dev/null "${SOURCES[@]}" >&2
	local kdeb bdeb kpkg kver
	kdeb=$(find "$work/debs" -name 'linux-image-*.deb' -print -quit)
	bdeb=$(find "$work/debs" -name 'busybox-static_*.deb' -print -quit)
	[[ -n $kdeb && -n $bdeb ]] || die "the kernel or busybox package was not downloaded"
	kpkg=$(dpkg-deb -f "$kdeb" Package)
	kver=${kpkg#linux-image-}
	dpkg-deb -x "$kdeb" "$work/kernel"
	dpkg-deb -x "$bdeb" "$work/busybox"
	[[ -f $work/kernel/boot/vmlinuz-$kver ]] || die "no vmlinuz-$kver in $kpkg"
	extract_vmlinux "$work/kernel/boot/vmlinuz-$kver" "$out/vmlinux"
	select_modules "$work/kernel/lib/modules/$kver" "$out"
	install -m 0755 "$work/busybox/bin/busybox" "$out/busybox"
	python3 - "$out/release.json" "$kver" "$kpkg" "$(dpkg-deb -f "$kdeb" Version)" \
		"$(dpkg-deb -f "$bdeb" Version)" <<'PY'
import json, sys
path, kver, kpkg, kversion, bversion = sys.argv[1:]
with open(path, "w") as f:
    json.dump({"kernel_version": kver, "kernel_package": f"{kpkg}={kversion}",
               "busybox_package": f"busybox-static={bversion}"}, f, indent=2)
    f.write("\n")
PY
	rm -rf "$work"
}

main() {
	if [[ ${1:-} == __download ]]; then
		download "$2"
		return
	fi
	local out
	out=$CACHE_ROOT/kernel/$(key_of_files "fetch-kernel.sh=$SELF")
	if [[ ${1:-} == --dir ]]; then
		echo "$out"
		return
	fi
	export HOSTD_FETCH_SELF=$SELF
	cached_build "$out" release.json fetch
	echo "$out"
}

main "$@"
