/**
 * The unprivileged account QEMU runs as when hostd runs as root, so that a guest escaping into
 * QEMU lands in a process that owns nothing but its own VM's files. QEMU also runs under its
 * seccomp sandbox; this is the second layer.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

export interface VmUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
}

/** Looks `name` up in /etc/passwd; undefined when there is no such account. */
export function lookupUser(
  name: string,
  passwd = readFileSync('/etc/passwd', 'utf8'),
): VmUser | undefined {
  for (const line of passwd.split('\n')) {
    const [user, , uid, gid] = line.split(':');
    if (user === name && uid !== undefined && gid !== undefined) {
      return { name, uid: Number(uid), gid: Number(gid) };
    }
  }
  return undefined;
}

/**
 * The argv prefix that starts QEMU as `user` (none needed without one). QEMU deliberately has no
 * parent-death signal: a VM outlives a crash of hostd, and the next hostd re-adopts it.
 */
function launcher(user: VmUser | undefined): string[] {
  if (!user) return [];
  return [
    'setpriv',
    '--reuid',
    String(user.uid),
    '--regid',
    String(user.gid),
    '--clear-groups',
    '--',
  ];
}

/** True when `user` can read every file in `paths` (the guest kernel and initrd). */
export function canRead(user: VmUser, paths: string[]): boolean {
  const r = spawnSync('setpriv', [
    ...launcher(user).slice(1),
    'test',
    ...paths.flatMap((p, i) => (i ? ['-a', '-r', p] : ['-r', p])),
  ]);
  return r.status === 0;
}
