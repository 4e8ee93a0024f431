/**
 * The native side of the compute figures: the same code run by Debian's own python3 on the
 * host, in the same run as the guest side. Debian's interpreter (/usr/bin/python3), not the
 * python3 on PATH: a pyenv or venv interpreter does not see Debian's python3-matplotlib,
 * python3-pandas and python3-sklearn, which `npm run bench` installs as root
 * (scripts/host-packages, "bench only:"). On a Debian 12 host they are the very versions the
 * python template's guest runs (both come from bookworm), so a ratio measures emulation rather
 * than versions; each run reports both stacks (`compute_stack_*`) to show it.
 * `BENCH_NATIVE_PYTHON` names another interpreter.
 */
import { spawnSync } from 'node:child_process';

export const NATIVE_PYTHON = process.env.BENCH_NATIVE_PYTHON || '/usr/bin/python3';

/** Prints the interpreter's and the data stack's versions, one line, for both sides. */
export const STACK_VERSIONS = [
  'import importlib, platform',
  'def v(m):',
  '    try:',
  '        return importlib.import_module(m).__version__',
  '    except Exception:',
  '        return "-"',
  'print(" ".join(["python " + platform.python_version()] + [m + " " + v(m) for m in ("numpy", "pandas", "matplotlib", "sklearn")]))',
].join('\n');

/**
 * The stdout of `script` in the native interpreter, or why it could not run, as the figure's
 * `skipped: …` text (`debian`: the package that provides what the script needs).
 */
export function runNative(script: string, debian: string): { stdout: string } | string {
  const r = spawnSync(NATIVE_PYTHON, ['-c', script], { encoding: 'utf8', timeout: 120_000 });
  if (r.status === 0) return { stdout: r.stdout };
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
    return `skipped: no ${NATIVE_PYTHON} on the host (Debian: python3)`;
  }
  const missing = /ModuleNotFoundError: No module named '([^']+)'/.exec(r.stderr)?.[1];
  return missing
    ? `skipped: no ${missing} in the host's ${NATIVE_PYTHON} (Debian: ${debian}; npm run bench installs it as root)`
    : `skipped: the host's ${NATIVE_PYTHON} failed (${(r.error?.message ?? r.stderr.trim().split('\n').pop() ?? '').slice(0, 120)})`;
}

/** The JSON lists `script` prints natively, one per line, or why not (see runNative). */
export function runNativeLists(script: string, debian: string): number[][] | string {
  const r = runNative(script, debian);
  if (typeof r === 'string') return r;
  return r.stdout
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('['))
    .map((l) => JSON.parse(l) as number[]);
}

/** The native stack's versions (STACK_VERSIONS), or why not. */
export function nativeStack(): string {
  const r = runNative(STACK_VERSIONS, 'python3');
  return typeof r === 'string' ? r : r.stdout.trim();
}
