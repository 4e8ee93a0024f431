/** `sbx exec`: runs code, streaming its output, and saves image displays to files. */
import { readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ConnectionOptions } from '../config.js';
import { imageExtension, toDisplay } from '../display.js';
import { Sandbox, type ExecOptions } from '../sandbox.js';
import type { Display } from '../types.js';
import { UsageError, keyValues, secondsOption, type Command } from './command.js';

export const exec: Command = {
  usage: 'sbx exec ID [--bash] [--timeout S] [--env K=V] [--cwd DIR] [--display-dir DIR] CODE|-',
  summary: "run code, streaming its output; exit with the code's exit status",
  details: `  CODE               the code to run; - reads it from stdin
  --bash             run CODE with bash in a fresh process (default: the sandbox's Python
                     REPL, where state persists between execs)
  --timeout S        interrupt the code after S seconds (it then exits 124)
  --env NAME=VALUE   environment for this exec only (repeatable)
  --cwd DIR          working directory for this exec only (absolute)
  --display-dir DIR  Python rich outputs: write each image (a matplotlib figure, ...) to
                     DIR/display-N.png (or .jpeg, .svg) and print the file's path on stdout;
                     print the text of other displays (a DataFrame, ...)

stdout and stderr lines are written to sbx's stdout and stderr as they arrive.`,
  options: {
    bash: { type: 'boolean' },
    timeout: { type: 'string' },
    env: { type: 'string', multiple: true },
    cwd: { type: 'string' },
    'display-dir': { type: 'string' },
  },
  async run(positionals, values, conn) {
    const [id, codeArg, ...extra] = positionals;
    if (id === undefined || codeArg === undefined)
      throw new UsageError('exec needs ID and CODE', 'exec');
    if (extra.length > 0) {
      throw new UsageError(
        `exec takes one CODE argument (quote it), got also: ${extra.join(' ')}`,
        'exec',
      );
    }
    const opts: ExecOptions = { language: values.bash ? 'bash' : 'python' };
    const timeoutMs = secondsOption('exec', '--timeout', values.timeout as string | undefined);
    if (timeoutMs !== undefined) opts.timeoutMs = timeoutMs;
    const env = keyValues('exec', '--env', values.env as string[] | undefined);
    if (env !== undefined) opts.env = env;
    if (typeof values.cwd === 'string') opts.cwd = values.cwd;
    const displayDir = values['display-dir'] as string | undefined;
    if (displayDir !== undefined) opts.display = true;
    const code = codeArg === '-' ? readFileSync(0, 'utf8') : codeArg;
    return execStreaming(id, code, opts, displayDir, conn);
  },
};

/** Streams one exec to this process's stdout and stderr; Ctrl-C interrupts the code. */
async function execStreaming(
  id: string,
  code: string,
  opts: ExecOptions,
  displayDir: string | undefined,
  conn: ConnectionOptions,
): Promise<number> {
  const abort = new AbortController();
  const onSigint = (): void => abort.abort();
  process.once('SIGINT', onSigint);
  // A closed stdout (`sbx exec ... | head`) ends the exec rather than crashing, with the
  // status a shell gives a process killed by SIGPIPE.
  let pipeClosed = false;
  const onPipeError = (): void => {
    pipeClosed = true;
    abort.abort();
  };
  process.stdout.once('error', onPipeError);
  const saver = displayDir === undefined ? undefined : new DisplaySaver(displayDir);
  try {
    const sandbox = await Sandbox.connect(id, { ...conn, signal: abort.signal });
    let exitCode = 1;
    for await (const event of sandbox.exec(code, { ...opts, signal: abort.signal })) {
      if (event.type === 'exit') exitCode = event.data;
      else if (event.type === 'stdout') process.stdout.write(`${event.data}\n`);
      else if (event.type === 'stderr') process.stderr.write(`${event.data}\n`);
      else if (event.type === 'display' && saver) {
        process.stdout.write(await saver.save(toDisplay(event.data)));
      }
    }
    return exitCode >= 0 && exitCode <= 255 ? exitCode : 1;
  } catch (err) {
    if (abort.signal.aborted) return pipeClosed ? 141 : 130;
    throw err;
  } finally {
    process.off('SIGINT', onSigint);
    process.stdout.off('error', onPipeError);
  }
}

/** Writes image displays to DIR/display-N.EXT, never over an existing file. */
class DisplaySaver {
  #next = 1;

  constructor(readonly dir: string) {}

  /** What to print for the display: the saved file's path, or the display's text. */
  async save(display: Display): Promise<string> {
    const ext = imageExtension(display);
    if (ext === undefined) return display.text === undefined ? '' : `${display.text}\n`;
    const bytes = ext === 'svg' ? Buffer.from(display.svg!, 'utf8') : display[ext]!;
    await mkdir(this.dir, { recursive: true });
    for (;;) {
      const path = join(this.dir, `display-${this.#next++}.${ext}`);
      try {
        await writeFile(path, bytes, { flag: 'wx' });
        return `${path}\n`;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
    }
  }
}
