#!/bin/bash
# Builds the hostd guest image for QEMU's microvm machine from Debian bookworm packages, into a
# cache keyed by the recipe, and prints the image directory.
#
#   guest/image/build.sh            -> prints ~/.cache/hostd/images/<key>
#
# The image directory holds:
#   vmlinux        uncompressed ELF kernel (PVH entry; boots with -kernel on microvm), extracted
#                  from the lz4 payload of linux-image-cloud-amd64's vmlinuz
#   initrd.cpio    uncompressed newc cpio holding the whole root filesystem; the kernel unpacks it
#                  into a tmpfs in guest RAM, so guest-memory copy-on-write is filesystem
#                  copy-on-write too
#   manifest.json  key, kernel version, the kernel command line hostd must pass with -append, the
#                  extra settings TCG needs, file sizes and hashes, the Debian package versions
#
# key = first 16 hex digits of a sha256 over the recipe: this script, ./init, ./packages and every
# guest/agent/*.py. A cached image (complete manifest) is reused at once. A build runs in a
# temporary directory next to the cache and is renamed into place, so a reader never sees half an
# image; the temporary directory goes away on failure too.
#
# Environment:
#   HOSTD_CACHE_DIR                 cache root (default ~/.cache/hostd); images go to <root>/images
#   HOSTD_AGENT_DIR                 directory of the agent's *.py (default guest/agent)
#   HOSTD_DEBIAN_MIRROR             Debian mirror (default http://deb.debian.org/debian)
#   HOSTD_DEBIAN_SECURITY_MIRROR    security mirror (default http://deb.debian.org/debian-security)
#   HOSTD_MMDEBSTRAP_MODE           mmdebstrap --mode (default auto: root if root, else unshare)
#
# Needs the commands it names in host_deps_require (scripts/host-packages says their packages).
set -euo pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")
AGENT_DIR=${HOSTD_AGENT_DIR:-$(dirname "$HERE")/agent}
CACHE=${HOSTD_CACHE_DIR:-$HOME/.cache/hostd}/images
MIRROR=${HOSTD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${HOSTD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
KERNEL_METAPACKAGE=linux-image-cloud-amd64
# Drivers to load at boot; build.sh adds their dependencies in load order and skips built-ins.
MODULES=(virtio_mmio virtio_console)
# Fixed file times, so the same packages give the same bytes.
export SOURCE_DATE_EPOCH=1704067200

# Kernel command line for every accelerator (manifest "cmdline"; hostd passes it with -append):
#   console=ttyS0      kernel and init messages on the serial port, which hostd keeps as the VM log
#   quiet              warnings and errors only; every console byte costs time under TCG
#   panic=-1           reboot at once on a panic: with -no-reboot, QEMU then exits
#   tsc=reliable       no clocksource watchdog: under TCG it sees "skew" between the TSC and
#                      jiffies and switches the guest to the 4 ms jiffies clock
#   no_timer_check     skip the IO-APIC timer probe
#   cryptomgr.notests  skip the crypto self-tests (about 0.35 s under TCG)
#   init_on_alloc=0    no zeroing of every allocated page (Debian's hardening default), and
#   mitigations=off    no Spectre/Meltdown mitigations: inside the sandbox VM every process is
#                      root anyway, so they guard no boundary; the VM is the boundary
#   nowatchdog         no lockup detector: a starved or paused-and-restored vCPU trips it
#   psi=0, sysctl.vm.compaction_proactiveness=0
#                      no pressure accounting and no background compaction: periodic kernel
#                      work that every restored VM would otherwise run (and, under TCG,
#                      translate) before it answers; nothing in the guest reads them
CMDLINE="console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check cryptomgr.notests init_on_alloc=0 mitigations=off nowatchdog psi=0 sysctl.vm.compaction_proactiveness=0"
# Under TCG the kernel cannot reliably calibrate the TSC against microvm's emulated PIT (most
# boots fail it and then hang with no timer), so hostd must append this, filled with the host's
# TSC frequency (TCG's guest TSC is the host TSC; /proc/cpuinfo "cpu MHz" on a VM host), and
# use this CPU model: RDRAND seeds the guest's RNG at once instead of 2 s of jitter entropy, and
# ARAT (the LAPIC timer keeps running when idle) lets the kernel use one-shot timers without a
# broadcast device (microvm has no HPET and we turn the PIT off): high-resolution timers and a
# tickless idle. Without it every idle VM took ~300 timer interrupts a second, 5-7% of a core.
TCG_CMDLINE_APPEND='tsc_early_khz={host_tsc_khz}'
TCG_CPU='qemu64,+rdrand,+arat'

log() { echo "build.sh: $*" >&2; }
# shellcheck source=../../scripts/lib/host-deps.sh
. "$HERE/../../scripts/lib/host-deps.sh"
die() { log "error: $*"; exit 1; }

# The files whose content defines the image, one "label path" per line.
recipe_files() {
	echo "image/build.sh $SELF"
	echo "image/init $HERE/init"
	echo "image/packages $HERE/packages"
	local f
	for f in "$AGENT_DIR"/*.py; do
		echo "agent/$(basename "$f") $f"
	done
}

compute_key() {
	local label path
	recipe_files | while read -r label path; do
		printf '%s %s\n' "$label" "$(sha256sum <"$path" | cut -d' ' -f1)"
	done | sha256sum | cut -c1-16
}

is_complete() {
	[[ -s $1/manifest.json && -s $1/vmlinux && -s $1/initrd.cpio ]]
}

package_list() {
	sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/packages" | grep -v '^$' | paste -sd,
}

# --- runs inside mmdebstrap (customize hook): $1 is the root filesystem ---------------------------

# Adds the wanted kernel modules and their dependencies from the unpacked kernel package, and
# writes their load order to /etc/hostd/modules for /init.
install_modules() {
	local root=$1 moddir=$2 kver=$3
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
		order+=("${ko#"$moddir"/}")
	}
	local m
	for m in "${MODULES[@]}"; do visit "$m"; done
	mkdir -p "$root/etc/hostd"
	: >"$root/etc/hostd/modules"
	for m in "${order[@]}"; do
		install -D -m 0644 "$moddir/$m" "$root/usr/lib/modules/$kver/$m"
		echo "/usr/lib/modules/$kver/$m" >>"$root/etc/hostd/modules"
	done
	log "modules in load order: ${order[*]##*/}"
}

# Removes what a sandbox never needs. Docs, man pages, locales and info pages are already kept out
# by dpkg path-exclude; dpkg's database stays. apt itself is not installed (Essential set only), so
# all of its state goes, including mmdebstrap's setup files (hence --skip=cleanup/apt,...).
strip_rootfs() {
	local root=$1
	rm -rf "$root"/etc/apt "$root"/var/lib/apt "$root"/var/cache/apt \
		"$root"/usr/share/bash-completion \
		"$root"/usr/lib/x86_64-linux-gnu/gconv # iconv modules for legacy charsets; UTF-8 is built in
	find "$root/var/log" -type f -delete
	rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
		"$root"/var/cache/ldconfig/aux-cache
}

install_files() {
	local root=$1 f
	install -m 0755 "$HERE/init" "$root/init"
	install -d -m 0755 "$root/opt/hostd"
	for f in "$AGENT_DIR"/*.py; do
		install -m 0644 "$f" "$root/opt/hostd/"
	done
	echo sandbox >"$root/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
		>"$root/etc/hosts"
	[[ -e $root/etc/mtab ]] || ln -s ../proc/self/mounts "$root/etc/mtab"
	install -d -m 0700 "$root/root"
	install -d -m 1777 "$root/tmp"
}

customize() {
	local root=$1
	local b=$root/tmp/hostd-build
	mkdir -p "$b"
	export APT_CONFIG=$MMDEBSTRAP_APT_CONFIG

	# The kernel: the versioned package the metapackage depends on, fetched with this build's own
	# apt setup (same mirrors and index as the root filesystem) and only unpacked, never installed.
	local kpkg kver
	kpkg=$(apt-cache depends "$KERNEL_METAPACKAGE" |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
	[[ -n $kpkg ]] || die "cannot resolve $KERNEL_METAPACKAGE"
	log "kernel package $kpkg"
	(cd "$b" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2)
	dpkg-deb -x "$b/${kpkg}"_*.deb "$b/kernel"
	kver=${kpkg#linux-image-}
	[[ -f $b/kernel/boot/vmlinuz-$kver ]] || die "no vmlinuz-$kver in $kpkg"
	mv "$b/kernel/boot/vmlinuz-$kver" "$b/vmlinuz"
	echo "$kver $kpkg $(dpkg-deb -f "$b/${kpkg}"_*.deb Version)" >"$b/kernel-release"
	install_modules "$root" "$b/kernel/lib/modules/$kver" "$kver"
	rm -rf "$b/kernel" "$b"/*.deb

	strip_rootfs "$root"
	install_files "$root"
	# Byte-compile the whole standard library (Debian compiles only part of it at install time):
	# compiling on import costs seconds under TCG. unchecked-hash: the image is immutable, so
	# Python never needs to stat or hash the sources, and the .pyc carry no timestamps.
	chroot "$root" /usr/bin/python3 -m compileall -q -f --invalidation-mode unchecked-hash \
		/usr/lib/python3.11 /opt/hostd >&2
	dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${Package}=${Version}\n' >"$b/packages.lock"
}

# --- runs on the host ------------------------------------------------------------------------------

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

# Converts mmdebstrap's tar to a newc cpio without needing root: entries sorted by name, owners,
# modes and (clamped) times from the tar, device numbers zeroed, inodes numbered in order. The
# first entry of a hard-link group carries the data, later ones are empty, as the kernel expects.
tar_to_cpio() {
	python3 - "$1" "$2" <<'PY'
import sys, tarfile

src, dst = sys.argv[1], sys.argv[2]
TYPES = {tarfile.REGTYPE: 0o100000, tarfile.AREGTYPE: 0o100000, tarfile.DIRTYPE: 0o040000,
         tarfile.SYMTYPE: 0o120000, tarfile.CHRTYPE: 0o020000, tarfile.BLKTYPE: 0o060000,
         tarfile.FIFOTYPE: 0o010000}


def norm(name):
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def header(ino, mode, uid, gid, nlink, mtime, size, rmaj, rmin, name):
    n = name.encode() + b"\0"
    h = b"070701" + b"".join(b"%08X" % v for v in
                             (ino, mode, uid, gid, nlink, mtime, size, 0, 0, rmaj, rmin, len(n), 0))
    return h + n + b"\0" * (-(len(h) + len(n)) % 4)


with tarfile.open(src) as tar, open(dst, "wb") as out:
    members = {norm(m.name): m for m in tar.getmembers() if norm(m.name)}
    # Hard-link groups, keyed by the member that holds the data.
    group = {}
    for name, m in members.items():
        if m.type == tarfile.LNKTYPE:
            group.setdefault(norm(m.linkname), []).append(name)
    for name in ("init", "dev/console", "usr/bin/python3"):
        if name not in members:
            sys.exit(f"tar_to_cpio: {name} missing from the root filesystem")
    ino, inode_of, written = 0, {}, set()
    for name in sorted(members):
        m = members[name]
        target = norm(m.linkname) if m.type == tarfile.LNKTYPE else name
        data_member = members[target]
        if target not in inode_of:
            ino += 1
            inode_of[target] = ino
        nlink = 1 + len(group.get(target, [])) if data_member.isfile() else (2 if m.isdir() else 1)
        mode = TYPES[data_member.type] | (data_member.mode & 0o7777)
        body = b""
        if data_member.isfile() and target not in written:
            body = tar.extractfile(data_member).read()
            written.add(target)
        elif m.issym():
            body = m.linkname.encode()
        rmaj, rmin = (m.devmajor, m.devminor) if (m.ischr() or m.isblk()) else (0, 0)
        out.write(header(inode_of[target], mode, m.uid, m.gid, nlink, int(m.mtime), len(body),
                         rmaj, rmin, name))
        out.write(body + b"\0" * (-len(body) % 4))
    trailer = header(0, 0, 0, 0, 1, 0, 0, 0, 0, "TRAILER!!!")
    out.write(trailer)
    out.write(b"\0" * (-out.tell() % 512))
PY
}

write_manifest() {
	local image=$1 key=$2 work=$3 kver kpkg kpkg_version
	read -r kver kpkg kpkg_version <"$work/kernel-release"
	python3 - "$image" "$key" "$kver" "$kpkg" "$kpkg_version" "$CMDLINE" "$TCG_CMDLINE_APPEND" \
		"$TCG_CPU" "$work/packages.lock" "$SUITE" "$MIRROR" <<'PY'
import datetime, hashlib, json, os, sys

(image, key, kver, kpkg, kpkg_version, cmdline, tcg_append, tcg_cpu, lock, suite,
 mirror) = sys.argv[1:]
files = {}
for name in ("vmlinux", "initrd.cpio"):
    h = hashlib.sha256()
    with open(os.path.join(image, name), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    files[name] = {"size_bytes": os.path.getsize(os.path.join(image, name)), "sha256": h.hexdigest()}
manifest = {
    "key": key,
    "kernel_version": kver,
    "kernel_package": f"{kpkg}={kpkg_version}",
    "cmdline": cmdline,
    "tcg": {
        "cmdline_append": tcg_append,
        "cpu": tcg_cpu,
        "note": "under TCG append cmdline_append with {host_tsc_khz} filled in, and use -cpu cpu",
    },
    "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "size_bytes": sum(f["size_bytes"] for f in files.values()),
    "files": files,
    "debian": {"suite": suite, "mirror": mirror,
               "packages": open(lock).read().split()},
}
with open(os.path.join(image, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
PY
}

build() {
	local key=$1 out=$2 tmp=$3
	local work=$tmp/work image=$tmp/image
	mkdir -p "$work" "$image"
	host_deps_require mmdebstrap apt-get dpkg-deb lz4 modinfo python3 flock sha256sum
	log "building image $key (packages: $(package_list))"
	export HOSTD_BUILD_SELF=$SELF HOSTD_AGENT_DIR=$AGENT_DIR
	# shellcheck disable=SC2016 # $1 and $HOSTD_BUILD_SELF expand in mmdebstrap's hook shell
	mmdebstrap --variant=essential --mode="${HOSTD_MMDEBSTRAP_MODE:-auto}" --format=tar \
		--include="$(package_list)" \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/lintian/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--skip=cleanup/apt,cleanup/mmdebstrap \
		--customize-hook='"$HOSTD_BUILD_SELF" __customize "$1"' \
		--customize-hook="download /tmp/hostd-build/vmlinuz $work/vmlinuz" \
		--customize-hook="download /tmp/hostd-build/kernel-release $work/kernel-release" \
		--customize-hook="download /tmp/hostd-build/packages.lock $work/packages.lock" \
		--customize-hook='rm -rf "$1/tmp/hostd-build"' \
		"$SUITE" "$work/rootfs.tar" \
		"deb $MIRROR $SUITE main" \
		"deb $MIRROR $SUITE-updates main" \
		"deb $SECURITY_MIRROR $SUITE-security main" >&2 &
	# In the background so that a signal reaches our trap now, not after mmdebstrap is done.
	child=$!
	wait "$child"
	child=

	extract_vmlinux "$work/vmlinuz" "$image/vmlinux"
	tar_to_cpio "$work/rootfs.tar" "$image/initrd.cpio"
	rm -f "$work/rootfs.tar"
	write_manifest "$image" "$key" "$work"
	mv -T "$image" "$out"
}

main() {
	if [[ ${1:-} == __customize ]]; then
		customize "$2"
		return
	fi
	[[ -f $AGENT_DIR/agent.py ]] || die "no agent.py in $AGENT_DIR (set HOSTD_AGENT_DIR)"
	local key out tmp
	key=$(compute_key)
	out=$CACHE/$key
	if is_complete "$out"; then
		echo "$out"
		return
	fi
	mkdir -p "$CACHE"
	# One build at a time; a waiter for the same key then finds the finished image.
	exec 9>"$CACHE/.build.lock"
	flock 9
	if is_complete "$out"; then
		echo "$out"
		return
	fi
	[[ ! -e $out ]] || rm -rf "$out" # an incomplete image from an older build script
	tmp=$(mktemp -d "$CACHE/.build-$key.XXXXXX")
	# shellcheck disable=SC2064 # expand $tmp now
	trap "rm -rf '$tmp'" EXIT
	trap 'if [[ -n ${child:-} ]]; then kill "$child"; wait "$child" || true; fi; exit 130' INT TERM HUP
	local t0=$SECONDS
	build "$key" "$out" "$tmp"
	log "built $out in $((SECONDS - t0)) s"
	echo "$out"
}

main "$@"
