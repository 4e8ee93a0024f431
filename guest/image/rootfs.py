"""Builds one template's root filesystem from its build spec; run by build-rootfs.sh as root in
fresh mount and PID namespaces (a user namespace when the builder is not root), so every mount
it makes and every process a setup command leaves behind goes away with it, also on failure.

    rootfs.py SPEC.json OUT_DIR

SPEC.json is written by src/vm/image/image-builder.ts (see its RootfsBuildSpec). OUT_DIR receives:

    rootfs.erofs   the root filesystem, read-only EROFS (the VM's first virtio disk)
    contents.json  every installed Debian package and every Python package pip installed

Every step prints a "hostd-build-step:" line first, which the TypeScript builder uses to say
which step failed. Standard library only: it runs on the host's Python.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

SOURCE_DATE_EPOCH = os.environ["SOURCE_DATE_EPOCH"]
GUEST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
    "PIP_NO_INPUT": "1",
}
# Where stage 1 of the boot mounts the agent; it must exist in every root filesystem.
AGENT_MOUNT = "opt/hostd"
HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "127.0.1.1\tsandbox\n"
    # The guest address of the host's network helper; sandbox-init puts it on lo.
    "10.0.2.2\thost.hostd.internal\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
)
# The unprivileged account every template has (E2B's convention: its SDKs run commands and write
# files as `user`, home /home/user, and sandboxed code may `sudo` to root without a password).
# Root stays what hostd's own API runs as.
SANDBOX_USER = {"name": "user", "uid": 1000, "home": "/home/user"}
# Fixed UUIDs so the same spec gives the same bytes; derived from the key so that two templates'
# filesystems still differ.
UUID_NAMESPACE = uuid.UUID("6b1f1c52-3f0e-4a51-9d0b-5f7d2f0c2a10")


_step = {"name": None, "t0": 0.0}


def step(name):
    """Announces a step, and how long the one before took (wall and CPU of its commands)."""
    now, cpu = time.monotonic(), _cpu_s()
    if _step["name"]:
        log(f"{_step['name']} took {now - _step['t0']:.1f} s, {cpu - _step['cpu']:.1f} s of CPU")
    _step.update(name=name, t0=now, cpu=cpu)
    if name:
        print(f"hostd-build-step: {name}", file=sys.stderr, flush=True)


def _cpu_s():
    own, children = os.times()[0:2], os.times()[2:4]
    return sum(own) + sum(children)


def log(msg):
    print(f"rootfs.py: {msg}", file=sys.stderr, flush=True)


def run(argv, quiet=False, **kw):
    if not quiet:
        log("$ " + shlex.join(argv))
    subprocess.run(argv, check=True, stdout=sys.stderr, **kw)


def chroot(root, argv, env=None):
    run(["chroot", root, *argv], env={**GUEST_ENV, **(env or {})}, cwd="/")


class Mounts:
    """The pseudo filesystems a chroot needs while the build runs; unmounted before packing."""

    def __init__(self, root):
        self.root, self.done = root, []

    def mount(self, argv, target):
        path = os.path.join(self.root, target)
        if not os.path.lexists(path):
            os.makedirs(path)
        run(["mount", *argv, path], quiet=True)
        self.done.append(path)

    def __enter__(self):
        self.mount(["-t", "proc", "proc"], "proc")
        # A /dev of the few nodes builds use, each bound from the host's, rather than the host's
        # whole /dev: in a user namespace those submounts would be locked and not unmount.
        self.mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], "dev")
        for node in ("null", "zero", "full", "random", "urandom", "tty"):
            open(os.path.join(self.root, "dev", node), "w").close()
            self.mount(["--bind", f"/dev/{node}"], f"dev/{node}")
        self.mount(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"], "dev/shm")
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, os.path.join(self.root, "dev", name))
        # Scratch space that must not end up in the image.
        self.mount(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"], "tmp")
        self.mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], "run")
        return self

    def __exit__(self, *exc):
        for path in reversed(self.done):
            run(["umount", path], quiet=True)
        self.done = []


def inside(root, path):
    """root + an absolute guest path, refusing anything that climbs out through '..'."""
    full = os.path.normpath(os.path.join(root, path.lstrip("/")))
    if not full.startswith(root.rstrip("/") + "/"):
        raise SystemExit(f"rootfs.py: {path} is outside the root filesystem")
    return full


def copy_files(root, files):
    # Staged under /tmp and installed from inside the chroot, so that a destination below a
    # symlink (/bin is /usr/bin) resolves the way it will in the guest.
    staging = inside(root, "tmp/hostd-files")
    os.makedirs(staging)
    for i, f in enumerate(files):
        step(f"files: {f['dest']}")
        staged = os.path.join(staging, str(i))
        if os.path.isdir(f["src"]):
            shutil.copytree(f["src"], staged, symlinks=False)
            for dirpath, dirnames, filenames in os.walk(staged):
                os.chmod(dirpath, 0o755)
                for name in filenames:
                    p = os.path.join(dirpath, name)
                    os.chmod(p, 0o755 if os.stat(p).st_mode & 0o100 else 0o644)
            chroot(root, ["mkdir", "-p", f["dest"]])
            chroot(root, ["cp", "-R", "--no-preserve=ownership", f"/tmp/hostd-files/{i}/.", f["dest"]])
        else:
            shutil.copyfile(f["src"], staged)
            chroot(root, ["install", "-D", "-o", "0", "-g", "0", "-m", format(f["mode"], "o"),
                          f"/tmp/hostd-files/{i}", f["dest"]])
    shutil.rmtree(staging)


def run_setup(root, commands, env):
    for i, cmd in enumerate(commands, 1):
        first = cmd.strip().splitlines()[0] if cmd.strip() else ""
        step(f"setup command {i} of {len(commands)}: {first[:80]}")
        chroot(root, ["/bin/bash", "-euo", "pipefail", "-c", cmd], env=env)


def install_python(root, python, env):
    if not python["packages"]:
        return
    step("python packages")
    argv = ["python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
            "--root-user-action=ignore", "--break-system-packages", "--no-compile"]
    if python["wheels"]:
        wheels = inside(root, "tmp/hostd-wheels")
        shutil.copytree(python["wheels"], wheels)
        argv += ["--find-links", "/tmp/hostd-wheels"]
    argv += ["--index-url", python["index_url"]] if python["index_url"] else ["--no-index"]
    chroot(root, argv + ["--", *python["packages"]], env=env)


def python_trees(root):
    trees = ["/usr/lib/python3", "/usr/lib/python3.11", "/usr/local/lib/python3.11"]
    return [t for t in trees if os.path.isdir(inside(root, t))]


def compile_python(root):
    # Compiling on import costs seconds under TCG, and Debian compiles only part of the tree at
    # install time (with timestamps). unchecked-hash: the image is immutable, so Python never
    # needs to stat or hash the sources, and the .pyc carry no timestamps.
    step("byte-compile python")
    argv = ["python3", "-m", "compileall", "-q", "-f", "-j", "0",
            "--invalidation-mode", "unchecked-hash", *python_trees(root)]
    log("$ chroot / " + shlex.join(argv))
    done = subprocess.run(["chroot", root, *argv], env=GUEST_ENV, cwd="/", stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    # Packages ship files that are not Python 3.11 (test data, templates, other versions'
    # code): compileall reports them and exits 1, and the interpreter never imports them.
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stdout)
        raise SystemExit(f"rootfs.py: compileall failed with exit status {done.returncode}")
    skipped = len(re.findall(r"^\*\*\* Error compiling", done.stdout, re.M))
    if skipped:
        log(f"compileall skipped {skipped} files that are not valid Python 3.11")


def configure(root, spec):
    step("configure")
    etc = inside(root, "etc")
    os.makedirs(os.path.join(etc, "hostd"), exist_ok=True)
    with open(os.path.join(etc, "hostd", "template.json"), "w") as f:
        json.dump(spec["template"], f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(etc, "hostname"), "w") as f:
        f.write("sandbox\n")
    with open(os.path.join(etc, "hosts"), "w") as f:
        f.write(HOSTS)
    for name in ("resolv.conf", "mtab"):
        if os.path.lexists(os.path.join(etc, name)):
            os.unlink(os.path.join(etc, name))
    os.symlink("../proc/self/mounts", os.path.join(etc, "mtab"))
    os.makedirs(inside(root, AGENT_MOUNT), mode=0o755, exist_ok=True)
    for path, mode in (("root", 0o700), ("tmp", 0o1777)):
        os.makedirs(inside(root, path), exist_ok=True)
        os.chmod(inside(root, path), mode)
    # Files that differ from build to build and that nothing in a sandbox reads.
    for dirpath, _, filenames in os.walk(inside(root, "var/log")):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
    for pattern_dir, suffix in (("var/cache/debconf", "-old"), ("var/lib/dpkg", "-old")):
        d = inside(root, pattern_dir)
        for name in os.listdir(d) if os.path.isdir(d) else []:
            if name.endswith(suffix):
                os.unlink(os.path.join(d, name))
    for path in ("var/cache/ldconfig/aux-cache", "etc/machine-id"):
        if os.path.lexists(inside(root, path)):
            os.unlink(inside(root, path))


def _accounts(root, name):
    """[fields] of each line of /etc/passwd or /etc/group in the root filesystem."""
    path = inside(root, f"etc/{name}")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.rstrip("\n").split(":") for line in f if line.strip()]


def _append(root, name, line, mode):
    path = inside(root, f"etc/{name}")
    if not os.path.exists(path) and name in ("shadow", "gshadow"):
        return                      # a system without shadow files: nothing to keep in step
    with open(path, "a") as f:
        f.write(line + "\n")
    os.chmod(path, mode)


def add_sandbox_user(root):
    """Adds SANDBOX_USER (group of the same name, a home from /etc/skel, passwordless sudo)
    unless a setup command made it already. Written into the account files directly: the
    Essential set has no useradd."""
    step("sandbox user")
    name, home = SANDBOX_USER["name"], SANDBOX_USER["home"]
    users, groups = _accounts(root, "passwd"), _accounts(root, "group")
    if any(u[0] == name for u in users):
        log(f"the image has a {name} account already: kept as it is")
        return
    taken = {int(u[2]) for u in users if len(u) > 2 and u[2].isdigit()}
    taken |= {int(g[2]) for g in groups if len(g) > 2 and g[2].isdigit()}
    uid = SANDBOX_USER["uid"]
    while uid in taken:
        uid += 1
    # No password: nobody logs in with one. The Essential set has no shadow files (base-passwd's
    # entries say '*' in place): an 'x' there would send PAM, and with it sudo, looking for a
    # shadow entry that does not exist ("could not obtain user info").
    shadow = os.path.exists(inside(root, "etc/shadow"))
    gshadow = os.path.exists(inside(root, "etc/gshadow"))
    _append(root, "group", f"{name}:{'x' if gshadow else '*'}:{uid}:", 0o644)
    _append(root, "gshadow", f"{name}:!::", 0o640)
    _append(root, "passwd", f"{name}:{'x' if shadow else '*'}:{uid}:{uid}::{home}:/bin/bash", 0o644)
    days = int(SOURCE_DATE_EPOCH) // 86400    # the password's "last changed", in days
    _append(root, "shadow", f"{name}:*:{days}:0:99999:7:::", 0o640)
    home_dir = inside(root, home)
    skel = inside(root, "etc/skel")
    if os.path.isdir(skel):
        shutil.copytree(skel, home_dir, symlinks=True, dirs_exist_ok=True)
    os.makedirs(home_dir, exist_ok=True)
    os.chmod(home_dir, 0o755)
    for dirpath, dirnames, filenames in os.walk(home_dir):
        for entry in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            os.lchown(entry, uid, uid)
    sudoers = inside(root, "etc/sudoers.d")
    if os.path.isdir(sudoers):
        with open(os.path.join(sudoers, "hostd-user"), "w") as f:
            f.write(f"{name} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        os.chmod(os.path.join(sudoers, "hostd-user"), 0o440)
    else:
        log("no /etc/sudoers.d (sudo is not installed): the user cannot become root")


def python_packages(root):
    """Name and version of each package pip installed (they go to /usr/local on Debian)."""
    found = []
    for tree in ("usr/local/lib/python3.11/dist-packages",):
        d = inside(root, tree)
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if not name.endswith(".dist-info"):
                continue
            meta = {}
            with open(os.path.join(d, name, "METADATA"), encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        break
                    k, _, v = line.partition(":")
                    meta.setdefault(k.strip(), v.strip())
            found.append({"name": meta.get("Name", name), "version": meta.get("Version", "")})
    return found


def make_erofs(root, out, key, compression):
    step("root filesystem image")
    argv = ["mkfs.erofs", "--quiet", f"-T{SOURCE_DATE_EPOCH}",
            f"-U{uuid.uuid5(UUID_NAMESPACE, 'rootfs-' + key)}"]
    if compression != "none":
        argv.append(f"-z{compression}")
    run(argv + [os.path.join(out, "rootfs.erofs"), root])


def main():
    spec_path, out = sys.argv[1], os.path.abspath(sys.argv[2])
    with open(spec_path) as f:
        spec = json.load(f)
    root = os.path.join(out, "root")
    os.makedirs(root)
    step("unpack debian packages")
    # Not /dev's device nodes: a user namespace may not make them, the build binds the host's
    # /dev over it, and the guest mounts a devtmpfs there.
    run(["tar", "-x", "-p", "--numeric-owner", "--xattrs", "--xattrs-include=*",
         "--exclude=./dev/*", "-f", os.path.join(spec["debian_dir"], "rootfs.tar"), "-C", root])
    env = spec["template"]["env"]
    with Mounts(root):
        # resolv.conf for setup commands and pip that use the network; removed in configure().
        resolv = inside(root, "etc/resolv.conf")
        if os.path.lexists(resolv):
            os.unlink(resolv)
        if os.path.exists("/etc/resolv.conf"):
            shutil.copyfile("/etc/resolv.conf", resolv)
        copy_files(root, spec["files"])
        run_setup(root, spec["setup"], env)
        install_python(root, spec["python"], env)
        compile_python(root)
    configure(root, spec)
    add_sandbox_user(root)
    with open(os.path.join(spec["debian_dir"], "packages.lock")) as f:
        installed = f.read().split()
    with open(os.path.join(out, "contents.json"), "w") as f:
        json.dump({"debian_installed": installed, "python_packages": python_packages(root)}, f,
                  indent=2)
        f.write("\n")
    make_erofs(root, out, spec["key"], spec["compression"])
    shutil.rmtree(root)
    step(None)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        # The command's own output is in the log just above; a traceback would bury it.
        argv = shlex.join(e.cmd) if isinstance(e.cmd, list) else str(e.cmd)
        log(f"failed with exit status {e.returncode}: {argv}")
        sys.exit(1)
