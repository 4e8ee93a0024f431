/**
 * Running the image scripts of guest/image as the steps of a template build: their output goes
 * to the template's build log, and a failure becomes a TemplateBuildError that says which step
 * failed and shows the last lines of the log, so that `GET /v1/templates` and
 * `npm run template` can explain a broken recipe without anyone opening the log.
 */
import { spawn } from 'node:child_process';
import { createWriteStream, type WriteStream } from 'node:fs';
import { mkdir, open } from 'node:fs/promises';
import { dirname } from 'node:path';

/** Lines of output an error message quotes. */
const TAIL_LINES = 25;
/** What the scripts print before each step (guest/image/lib.sh `step`, rootfs.py). */
const STEP_MARK = 'hostd-build-step: ';

/** A template build that failed; the log file stays for a closer look. */
export class TemplateBuildError extends Error {
  constructor(
    readonly template: string,
    /** The step that failed, e.g. `setup command 2 of 3: make install`. */
    readonly step: string,
    /** The build log, kept after the failure; null when the build failed before it began. */
    readonly logPath: string | null,
    /** Its last lines. */
    readonly tail: readonly string[],
    /** Why the step failed, e.g. `exit status 1`. */
    readonly reason: string,
  ) {
    super(
      `template "${template}": build step "${step}" failed (${reason})` +
        (logPath === null
          ? ''
          : `; log ${logPath}, last lines:\n${tail.map((l) => `  ${l}`).join('\n')}`),
    );
    this.name = 'TemplateBuildError';
  }
}

/** One template build's log file, and what an error about it needs to quote. */
export class BuildLog {
  private readonly tail: string[] = [];
  private partial = '';
  /** The step running now: the script's own finer step when it announced one. */
  step = 'start';

  private constructor(
    readonly template: string,
    readonly path: string,
    private readonly out: WriteStream,
    private readonly echo?: (line: string) => void,
  ) {}

  /** Starts a fresh log at `path`; `echo` also gets every line (e.g. a CLI's stderr). */
  static async open(template: string, path: string, echo?: (line: string) => void) {
    await mkdir(dirname(path), { recursive: true });
    const out = createWriteStream(path, { flags: 'w' });
    await new Promise<void>((resolve, reject) =>
      out.once('open', () => resolve()).once('error', reject),
    );
    return new BuildLog(template, path, out, echo);
  }

  /** Adds a line of the builder's own (a step start, a timing). */
  note(line: string): void {
    this.line(`hostd: ${line}`);
  }

  /** Output of a script, in arbitrary chunks. */
  write(chunk: string): void {
    const lines = (this.partial + chunk).split('\n');
    this.partial = lines.pop() ?? '';
    for (const l of lines) this.line(l);
  }

  private line(l: string): void {
    this.out.write(`${l}\n`);
    this.echo?.(l);
    if (l.startsWith(STEP_MARK)) this.step = l.slice(STEP_MARK.length);
    this.tail.push(l);
    if (this.tail.length > TAIL_LINES) this.tail.shift();
  }

  /** The error for the current step failing for `reason`. */
  failure(reason: string): TemplateBuildError {
    if (this.partial) this.line(this.partial);
    this.partial = '';
    return new TemplateBuildError(this.template, this.step, this.path, [...this.tail], reason);
  }

  async close(): Promise<void> {
    if (this.partial) this.line(this.partial);
    await new Promise<void>((resolve) => this.out.end(resolve));
  }
}

/**
 * Runs `bash script args...` as step `step`, its stderr (and stdout) into the log; returns the
 * last line of its stdout (the scripts print their result path last). Aborting `signal` stops
 * the script's whole process group; the scripts clean up after themselves on SIGTERM.
 */
export async function runScript(
  log: BuildLog,
  step: string,
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  signal?: AbortSignal,
): Promise<string> {
  log.step = step;
  log.write(`${STEP_MARK}${step}\n`);
  signal?.throwIfAborted();
  const child = spawn('bash', argv, { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let stdout = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
    log.write(d);
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => log.write(d));
  const stop = (): void => {
    if (child.pid !== undefined) {
      try {
        process.kill(-child.pid, 'SIGTERM');
      } catch {
        // already gone
      }
    }
  };
  signal?.addEventListener('abort', stop, { once: true });
  const t0 = Date.now();
  try {
    const [code, sig] = await new Promise<[number | null, NodeJS.Signals | null]>(
      (resolve, reject) => {
        child.once('error', (err) => reject(log.failure(`cannot run bash: ${err.message}`)));
        child.once('close', (c, s) => resolve([c, s]));
      },
    );
    if (signal?.aborted) throw log.failure('cancelled');
    if (code !== 0) throw log.failure(sig ? `killed by ${sig}` : `exit status ${code}`);
    log.note(`${step} took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  } finally {
    signal?.removeEventListener('abort', stop);
  }
  return stdout.trim().split('\n').pop() ?? '';
}

/**
 * The last `maxBytes` of a build log, from a line start; null when there is no log (the
 * template was never built with this cache). The log is read as it is: a build still running
 * shows how far it got.
 */
export async function readLogTail(path: string, maxBytes: number): Promise<string | null> {
  const file = await open(path, 'r').catch(() => null);
  if (!file) return null;
  try {
    const { size } = await file.stat();
    const start = Math.max(0, size - maxBytes);
    const buf = Buffer.alloc(size - start);
    const { bytesRead } = await file.read(buf, 0, buf.length, start);
    const text = buf.subarray(0, bytesRead).toString('utf8');
    return start === 0 ? text : text.slice(text.indexOf('\n') + 1);
  } finally {
    await file.close();
  }
}
