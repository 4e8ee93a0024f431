"""The guest's user accounts, as processes and file operations that run "as a user" see them
(guest/PROTOCOL.md, "Users"): who a name is (uid, gid, groups, home), how a path given by that
user resolves (relative to the home, `~`, `..` resolved), the environment a user's process
starts from, and uid/gid -> names for listings.

The agent runs as root; a user's processes get the user's ids before they run anything (see
credentials()), and files written for a user are chowned to them. Accounts are read from the
guest's own /etc/passwd and /etc/group at every lookup: sandboxed code may add users (useradd)
and expects them to work at once.
"""

import grp
import os
import posixpath
import pwd


class UnknownUser(Exception):
    """A user name the guest has no account for."""

    def __init__(self, name):
        super().__init__("unknown user %r" % (name,))
        self.name = name


class BadPath(Exception):
    """A path that cannot name a file (a NUL byte, not a string)."""


class User:
    __slots__ = ("name", "uid", "gid", "home", "groups")

    def __init__(self, name, uid, gid, home, groups):
        self.name, self.uid, self.gid, self.home, self.groups = name, uid, gid, home, groups

    @property
    def is_root(self):
        return self.uid == 0


def lookup(name):
    """The account `name`; UnknownUser when there is none."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise UnknownUser(name)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise UnknownUser(name) from None
    try:
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except OSError:
        groups = [pw.pw_gid]
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/", groups)


def resolve(path, home):
    """An absolute, normalised path for what a user gave: empty is the home, `~` and `~/x` are
    under the home, a relative path is relative to it, and `..` components are resolved
    lexically (as E2B's envd does: symbolic links are not followed)."""
    if not isinstance(path, str):
        raise BadPath("the path must be a string")
    if "\0" in path:
        raise BadPath("the path holds a NUL byte")
    if path == "" or path == "~":
        path = home
    elif path.startswith("~/"):
        path = posixpath.join(home, path[2:])
    elif not path.startswith("/"):
        path = posixpath.join(home, path)
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/")     # normpath keeps a leading "//"


def environment(user, base):
    """The environment a user's process starts from: `base` (the sandbox's default
    environment: PATH, LANG, the template's, the proxy's and the sandbox's own variables) with
    HOME, USER and LOGNAME of the user."""
    env = dict(base)
    env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    return env


def credentials(user):
    """A function for a child process (between fork and exec) that gives it the user's groups,
    gid and uid, in that order (after setuid nothing else could be changed). Root needs none."""
    if user.is_root:
        return None
    groups, gid, uid = list(user.groups), user.gid, user.uid

    def drop():
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    return drop


class Names:
    """uid -> user name and gid -> group name, cached for one operation (a listing); ids with no
    name come back as decimal strings, as `ls -n` would show them."""

    def __init__(self):
        self.users, self.groups = {}, {}

    def user(self, uid):
        name = self.users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self.users[uid] = name
        return name

    def group(self, gid):
        name = self.groups.get(gid)
        if name is None:
            try:
                name = grp.getgrgid(gid).gr_name
            except KeyError:
                name = str(gid)
            self.groups[gid] = name
        return name
