"""Local directory trees for the files tests: made from a description, read back into one."""

import os
import stat


def make_tree(root, tree):
    """``tree`` maps relative ``/``-separated paths to ``("file", content, mode)``, ``("dir",)``
    or ``("symlink", target)``."""
    os.makedirs(root, exist_ok=True)
    for path, node in tree.items():
        full = os.path.join(root, *path.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if node[0] == "dir":
            os.makedirs(full, exist_ok=True)
        elif node[0] == "symlink":
            os.symlink(node[1], full)
        else:
            with open(full, "w", encoding="utf-8") as f:
                f.write(node[1])
            os.chmod(full, node[2])


def read_tree(root, prefix=""):
    tree = {}
    for name in sorted(os.listdir(os.path.join(root, prefix) if prefix else root)):
        path = prefix + "/" + name if prefix else name
        full = os.path.join(root, *path.split("/"))
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            tree[path] = ("symlink", os.readlink(full))
        elif stat.S_ISDIR(st.st_mode):
            tree[path] = ("dir",)
            tree.update(read_tree(root, path))
        else:
            with open(full, encoding="utf-8") as f:
                tree[path] = ("file", f.read(), stat.S_IMODE(st.st_mode))
    return tree


def awkward_tree():
    """What tars find hard: nesting, an empty directory and an empty file, names over 100 bytes,
    non-ASCII names, a symlink, an executable."""
    long = "%s/%s/%s.txt" % ("d" * 60, "e" * 60, "f" * 80)
    return {
        "a.txt": ("file", "alpha\n", 0o644),
        "empty.txt": ("file", "", 0o600),
        "run.sh": ("file", "#!/bin/sh\necho hi\n", 0o755),
        "sub/deeper/b.bin": ("file", "x" * 70000, 0o644),
        "void": ("dir",),
        "\u00fcn\u00efc\u00f6d\u00e9 \u00f1ame.txt": ("file", "utf-8 name\n", 0o644),
        long: ("file", "long name\n", 0o644),
        "link": ("symlink", "sub/deeper/b.bin"),
    }
