/** Spawning the built CLI and README blocks, bounded in time, with their output captured. */
import { spawn } from 'node:child_process';
import { chmod, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CLI } from './live.js';

/**
 * The bound on a suite whose tests each start the CLI (a new node process, most of a second on
 * an idle host, several on a loaded one): node:test counts a suite's timeout over all its tests
 * together, and 60 s for a dozen starts failed on a slow host, not a hung one.
 */
export const CLI_SUITE_TIMEOUT_MS = 300_000;

export interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  env?: Record<string, string | undefined>;
  input?: string;
  cwd?: string;
  timeoutMs?: number;
  /** Called with each stdout chunk as it arrives. */
  onStdout?: (chunk: string) => void;
}

/** The environment without the client variables, so that tests choose them explicitly. */
export function cleanEnv(extra: Record<string, string | undefined> = {}): Record<string, string> {
  const env: Record<string, string | undefined> = { ...process.env };
  delete env.SERVICE_HOSTD_URL;
  delete env.SERVICE_API_KEY;
  Object.assign(env, extra);
  return Object.fromEntries(
    Object.entries(env).filter((e): e is [string, string] => e[1] !== undefined),
  );
}

export function run(command: string, args: string[], opts: RunOptions = {}): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      env: cleanEnv(opts.env),
      cwd: opts.cwd,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => {
      stdout += c;
      opts.onStdout?.(c);
    });
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
    child.stdin.end(opts.input ?? '');
  });
}

/** Runs `sbx ARGS` (the built dist/src/cli.js). */
export function sbx(args: string[], opts: RunOptions = {}): Promise<Ran> {
  return run(process.execPath, [CLI, ...args], opts);
}

/** A directory holding an executable `sbx` that runs the built CLI, to put on PATH. */
export async function sbxShimDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'hostd-sbx-bin-'));
  const shim = join(dir, 'sbx');
  await writeFile(shim, `#!/bin/sh\nexec '${process.execPath}' '${CLI}' "$@"\n`);
  await chmod(shim, 0o755);
  return dir;
}
