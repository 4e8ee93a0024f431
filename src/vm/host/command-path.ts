/**
 * Where a command runs from, as the shell would find it: the jail keeps QEMU's folder in view
 * (vm/host/vm-jail.ts) and frozen states are keyed by QEMU's binary (vm/qemu/hypervisor.ts).
 */
import { statSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** The first regular file `command` names on PATH (or `command` itself, with a slash); null if none. */
export function findCommand(
  command: string,
): { path: string; size: number; mtimeMs: number } | null {
  const dirs = command.includes('/') ? [''] : (process.env.PATH ?? '').split(delimiter);
  for (const dir of dirs) {
    const path = dir ? join(dir, command) : command;
    try {
      const st = statSync(path);
      if (st.isFile()) return { path, size: st.size, mtimeMs: st.mtimeMs };
    } catch {
      // not in this directory
    }
  }
  return null;
}
