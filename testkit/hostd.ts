/**
 * The testing module shared by the integration tests and the benchmark: starts a real hostd
 * (the compiled dist/src/main.js) as a child process on an ephemeral port with its own state
 * directory, talks to it, and finds its QEMU processes. Everything is read from hostd's API and
 * its directories (`hostd.url` and `vms/<vm>/qemu.pid` in the state directory, the sandbox
 * records `sandboxes/<id>.json` in the data directory), never from the wording of its logs; the
 * logs are kept only to print when a test fails.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { eventually } from './eventually.js';

export const ROOT = resolve(import.meta.dirname, '..', '..');

export interface Hostd {
  url: string;
  stateDir: string;
  dataDir: string;
  proc: ChildProcess;
  /** Every log line hostd printed (JSON from pino), for assertions and failure reports. */
  logs: string[];
  stop(signal?: NodeJS.Signals): Promise<number | null>;
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

export interface StartOptions {
  env?: Record<string, string>;
  /** Bearer key the request helpers send. */
  apiKey?: string;
  /** Resolve as soon as the process exits instead of waiting for "listening" (start-up failures). */
  expectExit?: boolean;
  stateDir?: string;
  /**
   * The data directory (frozen templates, memory images): by default a fresh one, removed by
   * `stop()`; given, it is kept (a restart test starts a second hostd on the first's).
   */
  dataDir?: string;
}

/** Resolves once hostd serves (it has written `hostd.url` into its state directory). */
export async function startHostd(opts: StartOptions = {}): Promise<Hostd> {
  if (!process.env.SERVICE_IMAGE_DIR) {
    throw new Error('SERVICE_IMAGE_DIR is not set: run the tests through `npm test`');
  }
  const stateDir = opts.stateDir ?? (await mkdtemp('/dev/shm/hostd-test-'));
  const ownDataDir = opts.dataDir === undefined;
  const dataDir = opts.dataDir ?? (await mkdtemp('/var/tmp/hostd-test-data-'));
  const proc = spawn(process.execPath, [join(ROOT, 'dist', 'src', 'main.js')], {
    env: {
      ...process.env,
      SERVICE_HOSTD_ADDR: '127.0.0.1:0',
      SERVICE_STATE_DIR: stateDir,
      SERVICE_DATA_DIR: dataDir,
      SERVICE_POOL_SIZE: '2',
      SERVICE_LOG_LEVEL: 'info',
      ...opts.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: string[] = [];
  const onLine = (line: string): void => {
    logs.push(line);
  };
  for (const stream of [proc.stdout!, proc.stderr!]) {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      buf += chunk;
      const lines = buf.split('\n');
      buf = lines.pop() ?? '';
      lines.forEach(onLine);
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
  const ours = async (): Promise<boolean> =>
    Number(await readFile(join(stateDir, 'hostd.pid'), 'utf8').catch(() => '')) === proc.pid;
  try {
    await eventually(
      'hostd to serve',
      async () => {
        if (exitCode !== undefined) return true;
        if (!(await ours())) return false;
        url = (await readFile(join(stateDir, 'hostd.url'), 'utf8').catch(() => '')).trim();
        return url !== '';
      },
      { timeoutMs: 180_000, everyMs: 20 },
    );
  } catch (err) {
    proc.kill('SIGKILL');
    throw new Error(`${(err as Error).message}:\n${logs.slice(-30).join('\n')}`);
  }
  if (!url && !opts.expectExit) {
    throw new Error(
      `hostd exited with code ${exitCode} during start-up:\n${logs.slice(-30).join('\n')}`,
    );
  }
  const authHeader: Record<string, string> = opts.apiKey
    ? { authorization: `Bearer ${opts.apiKey}` }
    : {};
  const request = (
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ) =>
    fetch(url + path, {
      method,
      headers: {
        ...authHeader,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...headers,
      },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
  return {
    url,
    stateDir,
    dataDir,
    proc,
    logs,
    request,
    async json<T>(method: string, path: string, body?: unknown) {
      const res = await request(method, path, body);
      const text = await res.text();
      return { status: res.status, body: (text ? JSON.parse(text) : undefined) as T };
    },
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      let code = exitCode;
      if (code === undefined) {
        proc.kill(signal);
        const timer = setTimeout(() => proc.kill('SIGKILL'), 60_000);
        code = await exited;
        clearTimeout(timer);
      }
      if (ownDataDir) await rm(dataDir, { recursive: true, force: true });
      return code;
    },
  };
}

/** The body of every error answer (docs/api.md, Errors). */
export interface ErrorBody {
  error: string;
  code: string;
}

/** Parses an NDJSON exec response into events. */
export interface ExecEvent {
  type: 'stdout' | 'stderr' | 'display' | 'exit';
  data: string | number | Record<string, unknown>;
  seq: number;
  ts: number;
  error?: string;
}

export async function execEvents(
  hostd: Hostd,
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<ExecEvent[]> {
  const res = await hostd.request('POST', `/v1/sandboxes/${id}/exec`, { code, ...extra });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`exec returned ${res.status}: ${text}`);
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as ExecEvent);
}

/** stdout, stderr joined (one line each) and the exit code of an exec. */
export async function run(
  hostd: Hostd,
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<{ stdout: string; stderr: string; exit: number; events: ExecEvent[] }> {
  const events = await execEvents(hostd, id, code, extra);
  const join = (t: string): string =>
    events
      .filter((e) => e.type === t)
      .map((e) => `${e.data}\n`)
      .join('');
  const exit = events.find((e) => e.type === 'exit');
  return {
    stdout: join('stdout'),
    stderr: join('stderr'),
    exit: exit ? Number(exit.data) : NaN,
    events,
  };
}

export async function createSandbox(hostd: Hostd, body: unknown = {}): Promise<string> {
  const res = await hostd.json<{ id: string; state: string }>('POST', '/v1/sandboxes', body);
  if (res.status !== 200)
    throw new Error(`create returned ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body.id;
}

/**
 * Runs `fn` with a fresh sandbox; on failure prints the sandbox id and its VM log tail, and
 * always deletes the sandbox.
 */
export async function withSandbox(hostd: Hostd, fn: (id: string) => Promise<void>): Promise<void> {
  const id = await createSandbox(hostd);
  try {
    await fn(id);
  } catch (err) {
    await reportFailure(hostd, id);
    throw err;
  } finally {
    await hostd.request('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  }
}

export async function reportFailure(hostd: Hostd, id: string): Promise<void> {
  const res = await hostd.request('GET', `/v1/sandboxes/${id}/logs`).catch(() => null);
  const tail = res ? await res.text() : '(no logs)';
  console.error(
    `\n=== test failed on sandbox ${id} ===\n${tail}\n=== hostd log tail ===\n${hostd.logs.slice(-20).join('\n')}\n`,
  );
}

/** True when no QEMU process mentions the directory and the directory is gone. */
export async function nothingLeft(stateDir: string): Promise<{ qemu: number; dirExists: boolean }> {
  const { findProcessesUsing } = await import('../src/state-dir.js');
  return { qemu: (await findProcessesUsing(stateDir)).length, dirExists: existsSync(stateDir) };
}

/** Reads a streamed exec response to its end and parses the remaining NDJSON events. */
export async function readRemainingEvents(
  reader: ReadableStreamDefaultReader<Uint8Array>,
): Promise<ExecEvent[]> {
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  return text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as ExecEvent);
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
  const { readFile } = await import('node:fs/promises');
  const { findProcessesUsing } = await import('../src/state-dir.js');
  const found: { pid: number; cmd: string }[] = [];
  for (const pid of await findProcessesUsing(stateDir)) {
    const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => null);
    if (cmd !== null) found.push({ pid, cmd: cmd.replace(/\0/g, ' ') });
  }
  return found;
}

/**
 * Waits until hostd has finished starting the QEMUs it keeps ready for forks (after each fork
 * it starts as many as that fork had children, one at a time, in the background) and returns
 * how many wait. `metrics` fetches hostd's /metrics text.
 */
export async function forkStandbySettled(metrics: () => Promise<string>): Promise<number> {
  const text = await eventually(
    'the fork standby to settle',
    async () => {
      const t = await metrics();
      return /^hostd_fork_standby_filling 0$/m.test(t) ? t : null;
    },
    { timeoutMs: 60_000, everyMs: 50 },
  );
  return Number(/^hostd_fork_standby_vms (\d+)$/m.exec(text)?.[1]);
}
