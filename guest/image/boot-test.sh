#!/bin/bash
# Boot test of a built hostd template, then an end-to-end check of VM templating with it.
#
#   guest/image/boot-test.sh [TEMPLATE_DIR]
#
# TEMPLATE_DIR (a directory with a manifest.json, see src/vm/image/image.ts) defaults to the template
# python-slim, built or reused through `node dist/src/template-cli.js path python-slim`. QEMU is
# started the way hostd starts it: the root filesystem read-only on the first virtio disk, and
# a copy-on-write qcow2 overlay of the template's disk.qcow2 as the writable second disk. Steps,
# each timed from QEMU spawn to the agent's hello reply:
#   1. cold boot of a template VM whose RAM is a share=on file in /dev/shm; hello; an exec probe
#      (free memory etc.), whose non-zero exit fails the test;
#   2. QMP stop, x-ignore-shared, migrate to exec:cat > state: device state only, the RAM stays
#      in the /dev/shm file and the disk writes in the template's overlay, which from then on
#      is the frozen base of every clone's own overlay;
#   3. clones, one after another: same command line with share=off (a private copy-on-write
#      mapping of the template's RAM file) and -incoming defer; migrate-incoming, cont, hello,
#      and a check that a file written in one clone is not seen by the next.
# It prints the QEMU command lines it used and removes every file and process it made, also
# on failure.
#
# Knobs for experiments (environment):
#   BOOT_TEST_ACCEL    tcg (default; /dev/kvm is unusable on the project's machines) or kvm
#   BOOT_TEST_APPEND   kernel command line (default: "cmdline" of the image manifest); under TCG
#                      the manifest's tcg.cmdline_append (tsc_early_khz=<host TSC kHz>) is added
#   BOOT_TEST_MACHINE  microvm options (default: the tuned set below)
#   BOOT_TEST_INITRD   another initrd file to boot (e.g. a compressed variant)
#   BOOT_TEST_ROOTFS   another root filesystem image to attach (e.g. an uncompressed variant)
#   BOOT_TEST_DISK     0: no writable disk (the writable layer is then a tmpfs in guest RAM)
#   BOOT_TEST_MEMORY_MIB   guest RAM (default: the manifest's resources.memory_mib, else 512)
#   BOOT_TEST_EXTRA    extra QEMU arguments, word-split
#   BOOT_TEST_COLD     number of cold boots to time (default 1; the last one becomes the template)
#   BOOT_TEST_CLONES   number of clones to restore one after another (default 2)
#   BOOT_TEST_PROBE    bash code run with the agent's exec op after the cold boot
#   BOOT_TEST_PROBE_TIMEOUT_S  seconds the probe may take (default 300)
#   BOOT_TEST_CONSOLE_OUT  copy the console log of the last cold boot to this file
#   BOOT_TEST_TIMEOUT_S    seconds to wait for a hello reply (default 60)
#   HOSTD_QEMU         QEMU binary (default qemu-system-x86_64)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
image_dir=${1:-$(node "$here/../../dist/src/template-cli.js" path python-slim)}
[[ -f $image_dir/manifest.json ]] || { echo "boot-test: no manifest in $image_dir" >&2; exit 1; }

work=$(mktemp -d /tmp/hostd-boot-test.XXXXXX)
shm_prefix=/dev/shm/hostd-boot-test-$$
cleanup() {
	# The Python driver stops its QEMUs itself; this catches what a crash of it would leave.
	if [[ -f $work/pids ]]; then
		while read -r pid; do
			# Only a QEMU of this run: its command line names our work dir.
			if grep -qF "$work" "/proc/$pid/cmdline" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
		done <"$work/pids"
	fi
	rm -rf "$work"
	rm -f "$shm_prefix"-*
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

export IMAGE_DIR=$image_dir WORK=$work SHM_PREFIX=$shm_prefix
python3 - <<'PY'
import json, os, secrets, shlex, socket, subprocess, sys, time

image = os.environ["IMAGE_DIR"]
work = os.environ["WORK"]
shm = os.environ["SHM_PREFIX"]
manifest = json.load(open(os.path.join(image, "manifest.json")))
qemu = os.environ.get("HOSTD_QEMU", "qemu-system-x86_64")
accel = os.environ.get("BOOT_TEST_ACCEL", "tcg")
append = os.environ.get("BOOT_TEST_APPEND", manifest["cmdline"])
# acpi=on is required: this kernel finds virtio-mmio devices only through ACPI (it is built
# without CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES); with acpi=off the boot never reaches the agent.
# pit and pic serve nothing once the TSC frequency is given; rtc gives the guest a sane clock
# before the first hello.
machine = os.environ.get(
    "BOOT_TEST_MACHINE",
    "microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=off,pic=off,acpi=on,auto-kernel-cmdline=off")
initrd = os.environ.get("BOOT_TEST_INITRD", os.path.join(image, manifest["initrd"]))
rootfs = os.environ.get("BOOT_TEST_ROOTFS", os.path.join(image, manifest["rootfs"]))
disk = (os.path.join(image, manifest["disk"])
        if manifest.get("disk") and os.environ.get("BOOT_TEST_DISK", "1") != "0" else None)
memory_mib = int(os.environ.get("BOOT_TEST_MEMORY_MIB")
                 or manifest.get("resources", {}).get("memory_mib", 512))
extra = os.environ.get("BOOT_TEST_EXTRA", "").split()
cold_runs = int(os.environ.get("BOOT_TEST_COLD", "1"))
clones = int(os.environ.get("BOOT_TEST_CLONES", "2"))
probe = os.environ.get(
    "BOOT_TEST_PROBE",
    "free -m; df -h /; grep -E ' / | /opt/hostd ' /proc/mounts; hostname; ls -ld /tmp /root; "
    "ls /sys/class/net; uname -r")
HELLO_TIMEOUT_S = float(os.environ.get("BOOT_TEST_TIMEOUT_S", "60"))
vms = []


def log(*a):
    print("boot-test:", *a, flush=True)


def host_tsc_khz():
    """TCG's guest TSC is the host TSC. On a VM host (where TCG is used) "cpu MHz" is its rate."""
    for line in open("/proc/cpuinfo"):
        if line.startswith("cpu MHz"):
            return round(float(line.split(":")[1]) * 1000)
    raise RuntimeError("no cpu MHz in /proc/cpuinfo")


if accel == "tcg":
    accel_args = ["-accel", "tcg,tb-size=64", "-cpu", manifest["tcg"]["cpu"]]
    append += " " + manifest["tcg"]["cmdline_append"].format(host_tsc_khz=host_tsc_khz())
else:
    accel_args = ["-accel", "kvm", "-cpu", "host"]


def boot_args(incoming):
    if incoming and os.environ.get("BOOT_TEST_CLONE_KERNEL", "1") == "0":
        return []
    return ["-kernel", os.path.join(image, manifest["kernel"]), "-initrd", initrd,
            "-append", append]


def disk_args(overlay):
    """The root filesystem read-only first, then this VM's writable overlay: hostd's order."""
    argv = ["-blockdev", f"driver=file,filename={rootfs},node-name=rootfs-file,read-only=on",
            "-blockdev", "driver=raw,file=rootfs-file,node-name=rootfs,read-only=on",
            "-device", "virtio-blk-device,drive=rootfs,serial=hostd-root"]
    if overlay:
        argv += ["-blockdev", f"driver=file,filename={overlay},node-name=disk-file",
                 "-blockdev", "driver=qcow2,file=disk-file,node-name=disk",
                 "-device", "virtio-blk-device,drive=disk,serial=hostd-disk"]
    return argv


def overlay_of(base, name):
    """A new qcow2 whose reads fall through to base and whose writes stay its own."""
    if not base:
        return None
    path = f"{work}/{name}.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, path],
                   check=True)
    return path


def qemu_argv(name, mem_path, share, incoming=False, overlay=None):
    argv = [qemu, "-M", f"{machine},memory-backend=mem", *accel_args,
            "-m", f"{memory_mib}M", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-object", f"memory-backend-file,id=mem,size={memory_mib}M,"
                       f"mem-path={mem_path},share={'on' if share else 'off'}",
            *boot_args(incoming), *disk_args(overlay),
            "-device", "virtio-serial-device,max_ports=3",
            "-chardev", f"socket,id=agent,path={work}/{name}.agent,server=on,wait=off",
            "-device", "virtserialport,chardev=agent,name=hostd.agent",
            # The agent needs its REPL worker's port too (guest/PROTOCOL.md); this test does
            # not use it.
            "-chardev", f"socket,id=repl,path={work}/{name}.repl,server=on,wait=off",
            "-device", "virtserialport,chardev=repl,name=hostd.repl",
            "-serial", f"file:{work}/{name}.console",
            "-qmp", f"unix:{work}/{name}.qmp,server=on,wait=off", *extra]
    if incoming:
        argv += ["-incoming", "defer"]
    return argv


class Lines:
    """Newline-delimited JSON over a unix socket."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self, deadline):
        while b"\n" not in self.buf:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no reply") from None
            if not chunk:
                raise EOFError("socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


class Vm:
    def __init__(self, name, mem_path, share, incoming=False, overlay=None):
        self.name = name
        self.overlay = overlay
        self.argv = qemu_argv(name, mem_path, share, incoming, overlay)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + HELLO_TIMEOUT_S
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
        vms.append(self)
        with open(os.path.join(work, "pids"), "a") as f:
            f.write(f"{self.proc.pid}\n")
        self.qmp = Lines(self.connect(f"{work}/{name}.qmp"))
        self.qmp.recv(self.deadline)  # greeting
        self.qmp_cmd("qmp_capabilities")
        self.agent = None

    def connect(self, path):
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: QEMU exited with {self.proc.returncode}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if time.monotonic() > self.deadline:
                    raise TimeoutError(f"no socket {path}") from None
                time.sleep(0.002)

    def qmp_cmd(self, name, **args):
        self.qmp.send({"execute": name, "arguments": args} if args else {"execute": name})
        while True:
            m = self.qmp.recv(time.monotonic() + 30)
            if "error" in m:
                raise RuntimeError(f"QMP {name}: {m['error']}")
            if "return" in m:
                return m["return"]  # anything else is an event

    def wait_migration(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = self.qmp_cmd("query-migrate").get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise RuntimeError(f"{self.name}: migration {status}")
            time.sleep(0.001)
        raise TimeoutError("migration")

    def hello(self):
        if self.agent is None:
            self.agent = Lines(self.connect(f"{work}/{self.name}.agent"))
        nonce = secrets.token_hex(8)
        self.agent.send({"op": "hello", "nonce": nonce, "time_ns": time.time_ns(),
                         "seed": secrets.token_hex(32)})
        while True:
            m = self.agent.recv(self.deadline)
            if m.get("op") == "hello" and m.get("nonce") == nonce:
                return m, time.monotonic() - self.t0

    def bash(self, code, timeout_s=20):
        """Runs code with the agent's exec op; returns (exit code, stdout lines)."""
        exec_id = secrets.randbelow(1 << 30)
        self.agent.send({"op": "exec", "id": exec_id, "language": "bash", "code": code})
        out, deadline = [], time.monotonic() + timeout_s
        while True:
            m = self.agent.recv(deadline)
            if m.get("id") != exec_id:
                continue
            if m.get("op") == "out":
                out.append(m["data"])
            elif m.get("op") == "exit":
                return m["code"], out

    def cpu_ms(self):
        """CPU time QEMU has used so far: steadier than wall time on a busy host."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")

    def rss(self):
        """QEMU's resident memory: anonymous (private) and shared-file (the RAM file) parts."""
        fields = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.strip()
        return ", ".join(f"{k} {int(fields[k].split()[0]) // 1024} MiB"
                         for k in ("RssAnon", "RssFile", "RssShmem") if k in fields)

    def console_tail(self, n=60):
        try:
            with open(f"{work}/{self.name}.console", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def quit(self):
        if self.proc.poll() is None:
            try:
                self.qmp_cmd("quit")
            except Exception:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


def cold_boot(i, mem_path):
    vm = Vm(f"cold{i}", mem_path, share=True, overlay=overlay_of(disk, f"cold{i}"))
    if i == 0:
        log("cold boot command line:", shlex.join(vm.argv))
    try:
        reply, dt = vm.hello()
    except Exception:
        log(f"cold boot failed; console tail:\n{vm.console_tail()}")
        raise
    log(f"cold boot {i}: hello reply after {dt * 1000:.0f} ms "
        f"(QEMU CPU time {vm.cpu_ms()} ms): {reply}")
    log(f"cold boot {i}: QEMU memory: {vm.rss()}")
    return vm


def run():
    log(f"image {image}")
    log(f"initrd {initrd} ({os.path.getsize(initrd)} bytes), root filesystem {rootfs} "
        f"({os.path.getsize(rootfs)} bytes), writable disk {disk or 'none (tmpfs)'}")
    template_mem = f"{shm}-template"
    vm = None
    for i in range(cold_runs):
        if vm:
            vm.quit()
        vm = cold_boot(i, template_mem)
    if os.environ.get("BOOT_TEST_CONSOLE_OUT"):
        with open(os.environ["BOOT_TEST_CONSOLE_OUT"], "w") as f:
            f.write(vm.console_tail(1 << 20))
    cpu0, t0 = vm.cpu_ms(), time.monotonic()
    code, out = vm.bash(probe, timeout_s=float(os.environ.get("BOOT_TEST_PROBE_TIMEOUT_S", "300")))
    log(f"probe: {(time.monotonic() - t0) * 1000:.0f} ms, QEMU CPU time {vm.cpu_ms() - cpu0} ms; "
        f"guest (exit {code}):\n" + "\n".join(out))
    if code != 0:
        raise RuntimeError(f"the probe exited with {code}")

    # The template: device state only; its RAM stays in the share=on file.
    t = time.monotonic()
    vm.qmp_cmd("stop")
    vm.qmp_cmd("migrate-set-capabilities",
               capabilities=[{"capability": "x-ignore-shared", "state": True}])
    state = f"{work}/state"
    vm.qmp_cmd("migrate", uri=f"exec:cat > {state}")
    vm.wait_migration()
    log(f"template saved in {(time.monotonic() - t) * 1000:.0f} ms, "
        f"state {os.path.getsize(state)} bytes")
    vm.quit()

    for i in range(clones):
        c = Vm(f"clone{i}", template_mem, share=False, incoming=True,
               overlay=overlay_of(vm.overlay, f"clone{i}"))
        if i == 0:
            log("clone command line:", shlex.join(c.argv))
        c.qmp_cmd("migrate-set-capabilities",
                  capabilities=[{"capability": "x-ignore-shared", "state": True}])
        c.qmp_cmd("migrate-incoming", uri=f"exec:cat {state}")
        c.wait_migration()
        t_restored = time.monotonic() - c.t0
        c.qmp_cmd("cont")
        try:
            reply, dt = c.hello()
        except Exception:
            log(f"clone {i} failed; console tail:\n{c.console_tail()}")
            raise
        log(f"clone {i}: restored after {t_restored * 1000:.0f} ms, hello reply after "
            f"{dt * 1000:.0f} ms (QEMU CPU time {c.cpu_ms()} ms): {reply}")
        log(f"clone {i}: QEMU memory: {c.rss()}")
        try:
            code, out = c.bash("cat /root/clone-mark 2>/dev/null || echo none; "
                               f"echo clone{i} > /root/clone-mark")
            log(f"clone {i}: mark left by an earlier clone: {' '.join(out)} "
                f"({'isolated' if out == ['none'] else 'NOT ISOLATED'})")
            if out != ["none"]:
                raise RuntimeError("clones share file system state")
        except (TimeoutError, EOFError) as e:
            log(f"clone {i}: exec check skipped: {e!r}")
        c.quit()


try:
    run()
except Exception as e:
    log(f"FAILED: {e!r}")
    sys.exit(1)
finally:
    for v in vms:
        v.quit()
PY
