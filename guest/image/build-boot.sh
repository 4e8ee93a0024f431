#!/bin/bash
# Builds the boot image every template shares, into the cache, and prints its directory:
#
#   guest/image/build-boot.sh         -> <cache>/boot/<key>
#   guest/image/build-boot.sh --dir   prints that directory without building anything
#
#   vmlinux        the kernel (a hard link to fetch-kernel.sh's)
#   initrd.cpio    uncompressed newc cpio: /init (./init), a static busybox, the kernel modules
#                  in load order, and in /hostd: stage 2 (./sandbox-init) and the guest agent
#                  (guest/agent/*.py, byte-compiled when the host's Python is the guest's)
#   boot.json      key, kernel version and packages, the kernel command line hostd must pass
#                  with -append, the extra settings TCG needs, file sizes and hashes
#
# key = this script, ./init, ./sandbox-init, every guest/agent/*.py and the kernel's key. The
# initrd is a few MB and takes a second to build, so an agent change costs no root filesystem
# rebuild (those live in build-rootfs.sh's cache).
#
# Environment: HOSTD_AGENT_DIR (default guest/agent), and lib.sh's.
set -euo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# shellcheck source=lib.sh
. "$(dirname "$SELF")/lib.sh"
AGENT_DIR=${HOSTD_AGENT_DIR:-$REPO_DIR/guest/agent}

# Kernel command line for every accelerator (boot.json "cmdline"; hostd passes it with -append):
#   console=ttyS0      kernel and init messages on the serial port, which hostd keeps as the VM log
#   quiet              warnings and errors only; every console byte costs time under TCG
#   panic=-1           reboot at once on a panic: with -no-reboot, QEMU then exits
#   tsc=reliable       no clocksource watchdog: under TCG it sees "skew" between the TSC and
#                      jiffies and switches the guest to the 4 ms jiffies clock
#   no_timer_check     skip the IO-APIC timer probe
#   cryptomgr.notests  skip the crypto self-tests (about 0.35 s under TCG)
#   init_on_alloc=0    no zeroing of every allocated page (Debian's hardening default), but
#   init_on_free=1     zeroing of every freed page instead: then a guest's free memory is zero,
#                      and hostd leaves pages zero here and in the image they were restored from
#                      out of forks, snapshots and paused sandboxes (vm/storage/page-delta.ts): a freed
#                      100 MiB buffer costs a paused sandbox nothing instead of 100 MiB to write
#                      and load back. A process's pages were zeroed when allocated and now are
#                      when freed (the kernel then skips the first); page cache and slab memory
#                      pay one zeroing more, when freed; and
#   mitigations=off    no Spectre/Meltdown mitigations: inside the sandbox VM every process is
#                      root anyway, so they guard no boundary; the VM is the boundary
#   nowatchdog         no lockup detector: a starved or paused-and-restored vCPU trips it
#   psi=0, sysctl.vm.compaction_proactiveness=0
#                      no pressure accounting and no background compaction: periodic kernel
#                      work that every restored VM would otherwise run (and, under TCG,
#                      translate) before it answers; nothing in the guest reads them
#   transparent_hugepage=never
#                      with THP on, the kernel keeps min_free_kbytes at 44 MiB for huge-page
#                      defragmentation, which `free` counts as unavailable (a 1 GiB python
#                      sandbox showed 76% of RAM available with the data stack loaded, 87%
#                      without THP); and a huge page the guest hands a process is 2 MiB it
#                      zeroes, which the host then backs for that VM alone
CMDLINE="console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check cryptomgr.notests init_on_alloc=0 init_on_free=1 mitigations=off nowatchdog psi=0 sysctl.vm.compaction_proactiveness=0 transparent_hugepage=never"
# Under TCG the kernel cannot reliably calibrate the TSC against microvm's emulated PIT (most
# boots fail it and then hang with no timer), so hostd must append this, filled with the host's
# TSC frequency (TCG's guest TSC is the host TSC; /proc/cpuinfo "cpu MHz" on a VM host), and
# use this CPU model: RDRAND seeds the guest's RNG at once instead of 2 s of jitter entropy, and
# ARAT (the LAPIC timer keeps running when idle) lets the kernel use one-shot timers without a
# broadcast device (microvm has no HPET and we turn the PIT off): high-resolution timers and a
# tickless idle. Without it every idle VM took ~300 timer interrupts a second, 5-7% of a core.
# `max` is everything TCG emulates (QEMU 7.2: SSE4.2, AVX, AVX2, FMA, F16C, BMI, MOVBE, RDRAND,
# ARAT among them) and nothing it does not: glibc, zlib, numpy and friends then take their
# vector paths, and a chart rendered to PNG in the guest took about 2.5 times less CPU than on
# qemu64,+rdrand,+arat (docs/architecture.md, "Compute under TCG"). A frozen state restores
# only into the QEMU that made it, so `max` changing with QEMU's version changes nothing there.
# clearcpuid=erms,rep_good: the kernel's own clear_page, memset, memcpy and copy to/from user
# space take their unrolled-loop versions rather than `rep stosb`/`rep movsb` (ERMS) or
# `rep stosq`/`rep movsq` (REP_GOOD). QEMU 7.2's TCG runs a `rep` string instruction one
# iteration per pass through its translated block, so zeroing one page by `rep stosb` is 4,096
# passes: with init_on_free that was about half of dropping a written file's cache before a
# pause (docs/architecture.md, "Where a small file operation and a pause spend their time").
# Only the kernel's choice changes: CPUID still shows ERMS to user space (glibc's memset and
# memcpy are issue 29's CPU-model question), and under KVM, where `rep` string operations are
# the fast ones, nothing is appended.
TCG_CMDLINE_APPEND='tsc_early_khz={host_tsc_khz} clearcpuid=erms,rep_good'
TCG_CPU='max'

# Lays out the initramfs tree in $1/tree.
stage_tree() {
	local tree=$1 kernel=$2 f
	install -d "$tree"/{bin,dev,proc,sys,lib/modules,hostd}
	install -m 0755 "$IMAGE_DIR/init" "$tree/init"
	install -m 0755 "$kernel/busybox" "$tree/bin/busybox"
	install -m 0644 "$kernel"/modules/*.ko "$tree/lib/modules/"
	install -m 0644 "$kernel/modules.order" "$tree/lib/modules/order"
	install -m 0755 "$IMAGE_DIR/sandbox-init" "$tree/hostd/sandbox-init"
	for f in "$AGENT_DIR"/*.py; do
		install -m 0644 "$f" "$tree/hostd/"
	done
	# unchecked-hash: the agent's files never change under a running guest, so Python need not
	# stat or hash the sources; the .pyc carry no timestamps. Another host Python writes files the
	# guest's would not read, so then the guest compiles on import (once per template boot).
	if python3 -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$GUEST_PYTHON'.split('.'))))"; then
		python3 -m compileall -q --invalidation-mode unchecked-hash "$tree/hostd" >&2
	else
		log "host Python is not $GUEST_PYTHON: the agent is compiled in the guest instead"
	fi
}

# Packs a directory into a newc cpio without needing root: entries sorted by name, owned by
# root, times fixed, plus the /dev/console node the kernel opens for init's stdio.
pack_cpio() {
	python3 - "$1" "$2" <<'PY'
import os, stat, sys

src, dst = sys.argv[1], sys.argv[2]
mtime = int(os.environ["SOURCE_DATE_EPOCH"])


def header(ino, mode, nlink, size, rmaj, rmin, name):
    n = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, rmaj, rmin, len(n), 0)
    h = b"070701" + b"".join(b"%08X" % v for v in fields)
    return h + n + b"\0" * (-(len(h) + len(n)) % 4)


entries = []
for dirpath, dirnames, filenames in os.walk(src):
    for name in dirnames + filenames:
        path = os.path.join(dirpath, name)
        entries.append((os.path.relpath(path, src), path))
with open(dst, "wb") as out:
    ino = 0
    for rel, path in sorted(entries + [("dev/console", None)]):
        ino += 1
        if path is None:
            out.write(header(ino, stat.S_IFCHR | 0o600, 1, 0, 5, 1, rel))
            continue
        st = os.lstat(path)
        perm = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            out.write(header(ino, stat.S_IFDIR | perm, 2, 0, 0, 0, rel))
            continue
        if not stat.S_ISREG(st.st_mode):
            sys.exit(f"pack_cpio: {rel} is neither a file nor a directory")
        with open(path, "rb") as f:
            body = f.read()
        out.write(header(ino, stat.S_IFREG | perm, 1, len(body), 0, 0, rel))
        out.write(body + b"\0" * (-len(body) % 4))
    out.write(header(0, 0, 1, 0, 0, 0, "TRAILER!!!"))
    out.write(b"\0" * (-out.tell() % 512))
PY
}

build() {
	local out=$1 kernel=$2 key=$3
	host_deps_require python3 sha256sum
	stage_tree "$out/tree" "$kernel"
	pack_cpio "$out/tree" "$out/initrd.cpio"
	rm -rf "$out/tree"
	ln "$kernel/vmlinux" "$out/vmlinux" 2>/dev/null || cp "$kernel/vmlinux" "$out/vmlinux"
	python3 - "$out" "$key" "$kernel/release.json" "$CMDLINE" "$TCG_CMDLINE_APPEND" "$TCG_CPU" <<'PY'
import hashlib, json, os, sys

out, key, release, cmdline, tcg_append, tcg_cpu = sys.argv[1:]
files = {}
for name in ("vmlinux", "initrd.cpio"):
    h = hashlib.sha256()
    with open(os.path.join(out, name), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    files[name] = {"size_bytes": os.path.getsize(os.path.join(out, name)), "sha256": h.hexdigest()}
boot = {
    "key": key,
    **json.load(open(release)),
    "cmdline": cmdline,
    "tcg": {
        "cmdline_append": tcg_append,
        "cpu": tcg_cpu,
        "note": "under TCG append cmdline_append with {host_tsc_khz} filled in, and use -cpu cpu",
    },
    "files": files,
}
with open(os.path.join(out, "boot.json"), "w") as f:
    json.dump(boot, f, indent=2)
    f.write("\n")
PY
}

main() {
	[[ -f $AGENT_DIR/agent.py ]] || die "no agent.py in $AGENT_DIR (set HOSTD_AGENT_DIR)"
	local kernel key f
	kernel=$("$IMAGE_DIR/fetch-kernel.sh" ${1:+"$1"})
	local -a inputs=("build-boot.sh=$SELF" "init=$IMAGE_DIR/init" "sandbox-init=$IMAGE_DIR/sandbox-init")
	for f in "$AGENT_DIR"/*.py; do
		inputs+=("agent/${f##*/}=$f")
	done
	key=$({
		key_of_files "${inputs[@]}"
		echo "kernel ${kernel##*/}"
	} | sha256sum | cut -c1-16)
	if [[ ${1:-} == --dir ]]; then
		echo "$CACHE_ROOT/boot/$key"
		return
	fi
	cached_build "$CACHE_ROOT/boot/$key" boot.json build "$kernel" "$key"
	echo "$CACHE_ROOT/boot/$key"
}

main "$@"
