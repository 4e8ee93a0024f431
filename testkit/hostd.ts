/**
 * The testing module shared by the integration tests and the benchmark: starts a real hostd
 * (the compiled dist/src/main.js) as a child process on an ephemeral port with its own state
 * directory, talks to it, and finds its QEMU processes. Everything is read from hostd's API and
 * its directories (`hostd.url` and `vms/<vm>/qemu.pid` in the state directory, the sandbox
 * records `sandboxes/<id>.json` in the data directory), never from the wording of its logs; the
 * logs are kept only to print when a test fails.
 *
 * The rest of testkit: sandboxes.ts (create, scoped cleanup, failure reports, waiting on a
 * sandbox's state), exec.ts (exec streams, holding a sandbox busy), metrics.ts (/metrics),
 * eventually.ts (waiting on a condition).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { eventually } from './eventually.js';
import { assertNoHostDetails, clientValues, errorTexts } from './host-details.js';
import { ROOT } from './root.js';
import { findProcessesUsing } from '../src/state-dir.js';
import { harvestTemplates, seedTemplates } from './template-seed.js';

/** A client of hostd's HTTP API: a hostd this process started, or one reached by URL. */
export interface Api {
  url: string;
  /** The Authorization header the helpers send, if any (for clients of their own). */
  headers: Record<string, string>;
  /**
   * hostd's state, data and cache directories: no answer may name them (testkit/host-details.ts
   * checks every error answer the helpers read).
   */
  hostDirs: readonly string[];
  request(
    method: string,
    path: string,
    body?: unknown,
    headers?: Record<string, string>,
  ): Promise<Response>;
  json<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; body: T }>;
}

/** A hostd this process started: its API, its process, its state directory and its logs. */
export interface Hostd extends Api {
  /** The E2B-compatible front's origin (docs/e2b.md), '' when SERVICE_E2B_ADDR=off. */
  e2bUrl: string;
  stateDir: string;
  dataDir: string;
  proc: ChildProcess;
  /** Every log line hostd printed (JSON from pino), printed when a test fails. */
  logs: string[];
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/** The body of every error answer (docs/api.md, Errors). */
export interface ErrorBody {
  error: string;
  code: string;
}

/** Strings and bytes go as they are (file uploads); anything else as JSON. */
function encodeBody(body: unknown): BodyInit | undefined {
  if (body === undefined || typeof body === 'string') return body;
  if (body instanceof Uint8Array) return body as Uint8Array<ArrayBuffer>;
  return JSON.stringify(body);
}

/**
 * An API client for the hostd at `url`, sending `Bearer apiKey` when given. Every error answer
 * it reads is checked for host details (`hostDirs` and the usual host places): the request that
 * got one throws.
 */
export function connect(url: string, apiKey?: string, hostDirs: readonly string[] = []): Api {
  const headers: Record<string, string> = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const request = async (
    method: string,
    path: string,
    body?: unknown,
    extra: Record<string, string> = {},
  ): Promise<Response> => {
    const res = await fetch(url + path, {
      method,
      headers: {
        ...headers,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...extra,
      },
      body: encodeBody(body),
    });
    if (res.status >= 300) {
      const text = await res.clone().text();
      const where = `${method} ${path.slice(0, 100)} (${res.status})`;
      assertNoHostDetails(where, text, hostDirs, clientValues(path));
    }
    return res;
  };
  return {
    url,
    headers,
    hostDirs,
    request,
    async json<T>(method: string, path: string, body?: unknown) {
      const res = await request(method, path, body);
      const text = await res.text();
      const parsed = (text ? JSON.parse(text) : undefined) as T;
      // A 2xx body's `error` fields (a failed sandbox, a template that did not build).
      for (const e of errorTexts(parsed)) {
        assertNoHostDetails(`the error field of ${method} ${path.slice(0, 100)}`, e, hostDirs);
      }
      return { status: res.status, body: parsed };
    },
  };
}

export interface StartOptions {
  env?: Record<string, string>;
  /** Bearer key the request helpers send. */
  apiKey?: string;
  /** Resolve as soon as the process exits instead of waiting for it to serve (start-up failures). */
  expectExit?: boolean;
  stateDir?: string;
  /**
   * The data directory (records, frozen templates, memory images): by default a fresh one,
   * removed by `stop()`; given, it is kept (a restart test starts a second hostd on the first's).
   */
  dataDir?: string;
  /**
   * How long start-up may take before the test gives up (default 15 min, the suite's test
   * timeout): each template served boots before hostd listens, which took 9 min for `python`
   * on a busy 2-core host under TCG. Only a hostd that hangs should ever reach it.
   */
  startTimeoutMs?: number;
  /**
   * What to run instead of `node dist/src/main.js`, from the repository's root: `['npm',
   * 'start']` measures what a user waits for. hostd is then a descendant of the process
   * started, so the state directory must not hold another run's `hostd.url`, and `stop()`
   * signals the hostd named by `hostd.pid`.
   */
  command?: readonly string[];
}

/** Resolves once hostd serves (it has written `hostd.url` into its state directory). */
export async function startHostd(opts: StartOptions = {}): Promise<Hostd> {
  const stateDir = opts.stateDir ?? (await mkdtemp('/dev/shm/hostd-test-'));
  // HOSTD_TEST_DATA_DIR: a data directory kept between runs, whose templates are booted already
  // (a loaded machine, where a template's cold boot can take minutes). Unset in CI.
  const dataDirGiven = opts.dataDir ?? process.env.HOSTD_TEST_DATA_DIR;
  const ownDataDir = dataDirGiven === undefined;
  const dataDir = dataDirGiven ?? (await mkdtemp('/var/tmp/hostd-test-data-'));
  await seedTemplates(dataDir);
  const [file, ...args] = opts.command ?? [process.execPath, join(ROOT, 'dist', 'src', 'main.js')];
  const proc = spawn(file!, args, {
    cwd: ROOT,
    env: {
      ...process.env,
      SERVICE_HOSTD_ADDR: '127.0.0.1:0',
      SERVICE_STATE_DIR: stateDir,
      SERVICE_DATA_DIR: dataDir,
      SERVICE_POOL_SIZE: '2',
      // One template unless a test asks for more: each boots at start, which costs seconds.
      SERVICE_TEMPLATES: 'python',
      SERVICE_LOG_LEVEL: 'info',
      ...opts.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: string[] = [];
  for (const stream of [proc.stdout!, proc.stderr!]) {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      buf += chunk;
      const lines = buf.split('\n');
      buf = lines.pop() ?? '';
      logs.push(...lines);
    });
  }
  let exitCode: number | null | undefined;
  const exited = new Promise<number | null>((r) =>
    proc.once('exit', (code) => {
      exitCode = code;
      r(code);
    }),
  );
  let url = '';
  // hostd.pid names the hostd that claimed the directory (emptied of an earlier run's files);
  // hostd.url appears once that hostd serves.
  const hostdPid = async (): Promise<number> =>
    Number(await readFile(join(stateDir, 'hostd.pid'), 'utf8').catch(() => ''));
  const ours = async (): Promise<boolean> =>
    opts.command !== undefined || (await hostdPid()) === proc.pid;
  /**
   * Signals hostd itself, not the command that started it (npm would pass a SIGTERM on, and a
   * second SIGTERM ends hostd before its clean stop is over).
   */
  const signalHostd = async (signal: NodeJS.Signals): Promise<void> => {
    const pid = opts.command === undefined ? 0 : await hostdPid();
    if (pid > 0) process.kill(pid, signal);
    else proc.kill(signal);
  };
  try {
    await eventually(
      'hostd to serve',
      async () => {
        if (exitCode !== undefined) return true;
        if (!(await ours())) return false;
        url = (await readFile(join(stateDir, 'hostd.url'), 'utf8').catch(() => '')).trim();
        return url !== '';
      },
      { timeoutMs: opts.startTimeoutMs ?? 900_000, everyMs: 20 },
    );
  } catch (err) {
    await signalHostd('SIGKILL');
    // VMs outlive a killed hostd (they are re-adopted at its next start): none is left here.
    await exited;
    for (const pid of await findProcessesUsing(stateDir)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    if (opts.stateDir === undefined) await rm(stateDir, { recursive: true, force: true });
    if (ownDataDir) await rm(dataDir, { recursive: true, force: true });
    throw new Error(`${(err as Error).message}:\n${logs.slice(-30).join('\n')}`);
  }
  if (!url && !opts.expectExit) {
    throw new Error(
      `hostd exited with code ${exitCode} during start-up:\n${logs.slice(-30).join('\n')}`,
    );
  }
  // Templates are frozen before hostd listens: later hostds of the run restore them.
  if (url) await harvestTemplates(dataDir);
  const cacheDir = opts.env?.SERVICE_CACHE_DIR ?? process.env.SERVICE_CACHE_DIR ?? '';
  // Written before hostd.url: it is there once hostd serves (absent when the front is off).
  const e2bUrl = url
    ? (await readFile(join(stateDir, 'e2b.url'), 'utf8').catch(() => '')).trim()
    : '';
  return {
    ...connect(
      url,
      opts.apiKey,
      [stateDir, dataDir, cacheDir].filter((d) => d !== ''),
    ),
    e2bUrl,
    stateDir,
    dataDir,
    proc,
    logs,
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      let code = exitCode;
      if (code === undefined) {
        await signalHostd(signal);
        // A cluster node drains first (its sandboxes go to other nodes): minutes on a loaded TCG host.
        const timer = setTimeout(() => void signalHostd('SIGKILL'), 180_000);
        code = await exited;
        clearTimeout(timer);
      }
      await harvestTemplates(dataDir);
      if (ownDataDir) await rm(dataDir, { recursive: true, force: true });
      return code;
    },
  };
}

/** True when no QEMU process mentions the directory and the directory is gone. */
export async function nothingLeft(stateDir: string): Promise<{ qemu: number; dirExists: boolean }> {
  return { qemu: (await findProcessesUsing(stateDir)).length, dirExists: existsSync(stateDir) };
}

/** PID of the QEMU behind sandbox `id`: its record names its VM, whose folder has the pid. */
export async function sandboxQemuPid(h: Hostd, id: string): Promise<number> {
  const record = JSON.parse(await readFile(join(h.dataDir, 'sandboxes', `${id}.json`), 'utf8')) as {
    vm: string;
  };
  return Number((await readFile(join(h.stateDir, 'vms', record.vm, 'qemu.pid'), 'utf8')).trim());
}

/** The QEMU processes of a hostd (those using its state directory) and their command lines. */
export async function qemuProcesses(stateDir: string): Promise<{ pid: number; cmd: string }[]> {
  const found: { pid: number; cmd: string }[] = [];
  for (const pid of await findProcessesUsing(stateDir)) {
    const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => null);
    if (cmd !== null) found.push({ pid, cmd: cmd.replace(/\0/g, ' ') });
  }
  return found;
}

/**
 * Resolves once process `pid` no longer exists: it died and its parent (hostd, for a QEMU)
 * has reaped it, so hostd has seen it exit.
 */
export async function processGone(what: string, pid: number): Promise<void> {
  await eventually(`${what} (pid ${pid}) to be gone`, () => !existsSync(`/proc/${pid}`), {
    timeoutMs: 30_000,
    everyMs: 20,
  });
}
