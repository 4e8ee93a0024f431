/**
 * Small C libraries hostd builds on the host for its QEMUs (vm/host/capstone-stand-in.ts,
 * vm/host/ram-open-shim.ts): compiled with `cc` into the template cache once per source, and
 * kept only if QEMU starts with them. C, because what they change is what the dynamic linker
 * loads into QEMU.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface QemuLibSpec {
  readonly cacheDir: string;
  readonly qemuBinary: string;
  readonly cc: string;
  /** The library's file name. */
  readonly file: string;
  readonly source: string;
  readonly flags: readonly string[];
  /** The environment that makes QEMU load the library at `lib`. */
  readonly env: (lib: string) => Record<string, string>;
}

/** The built library's path, or why there is none. */
export type QemuLib = { path: string } | { path: null; why: string };

/**
 * The library, built into `<cacheDir>/qemu-libs/<key>/` if it is not there yet (the key hashes
 * the source and flags), and only kept if `qemuBinary -version` starts with it. Builds of
 * concurrent hostds race harmlessly: each renames a complete file into place.
 */
export function qemuLib(spec: QemuLibSpec): QemuLib {
  const key = createHash('sha256')
    .update(`${spec.source}\0${spec.flags.join(' ')}`)
    .digest('hex')
    .slice(0, 16);
  const libs = join(spec.cacheDir, 'qemu-libs');
  const dir = join(libs, key);
  const lib = join(dir, spec.file);
  if (existsSync(lib)) return { path: lib };
  // Built beside, so that a failed build leaves nothing; QEMU's account must read the result,
  // whatever hostd's umask
  mkdirSync(libs, { recursive: true });
  chmodSync(libs, 0o755);
  const tmp = join(libs, `.build-${key}-${process.pid}`);
  mkdirSync(tmp, { recursive: true });
  try {
    const src = join(tmp, 'lib.c');
    writeFileSync(src, spec.source);
    const built = spawnSync(spec.cc, [...spec.flags, '-o', join(tmp, spec.file), src], {
      encoding: 'utf8',
    });
    if (built.error || built.status !== 0) {
      return {
        path: null,
        why: `${spec.cc} failed: ${built.error?.message ?? built.stderr.trim()}`,
      };
    }
    const qemu = spawnSync(spec.qemuBinary, ['-version'], {
      encoding: 'utf8',
      env: { PATH: process.env.PATH, ...spec.env(join(tmp, spec.file)) },
    });
    if (qemu.error || qemu.status !== 0) {
      return {
        path: null,
        why: `QEMU does not start with it: ${qemu.error?.message ?? (qemu.stderr.trim() || `exit code ${qemu.status}`)}`,
      };
    }
    chmodSync(join(tmp, spec.file), 0o644);
    mkdirSync(dir, { recursive: true });
    chmodSync(dir, 0o755);
    renameSync(join(tmp, spec.file), lib);
    return { path: lib };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}
