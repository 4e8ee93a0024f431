#!/usr/bin/env node
/**
 * `sbx`: the hostd command line, a thin layer over the SDK. Errors are one line on stderr
 * (`sbx: not found: sandbox sbx_… not found`) and exit status 1; usage mistakes exit 2;
 * `sbx exec` exits with the code's own exit status.
 */
import { readFileSync } from 'node:fs';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { DEFAULT_BASE_URL, type ConnectionOptions } from './config.js';
import { describeCode, isHostdError } from './errors.js';
import { Sandbox } from './sandbox.js';
import type { SandboxInfo } from './types.js';

type Options = NonNullable<ParseArgsConfig['options']>;
type Values = Record<string, string | boolean | undefined>;

interface Command {
  usage: string;
  summary: string;
  details: string;
  options: Options;
  run(positionals: string[], values: Values, conn: ConnectionOptions): Promise<number>;
}

/** A mistake in the command line: message, hint, exit status 2. */
class UsageError extends Error {
  constructor(
    message: string,
    readonly command?: string,
  ) {
    super(message);
  }
}

const GLOBAL_OPTIONS: Options = {
  url: { type: 'string' },
  'api-key': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

const GLOBAL_HELP = `Global options:
  --url URL        hostd base URL (default: $SERVICE_HOSTD_URL, else ${DEFAULT_BASE_URL})
  --api-key KEY    API key (default: $SERVICE_API_KEY; prefer the variable, arguments are
                   visible to other users of the machine)
  -h, --help       show help`;

const commands: Record<string, Command> = {
  create: {
    usage: 'sbx create [--template T]',
    summary: 'create a sandbox and print its id',
    details: '  --template T     template (pool) to create from; default: the server default',
    options: { template: { type: 'string', short: 't' } },
    async run(positionals, values, conn) {
      noPositionals('create', positionals);
      const template = values.template as string | undefined;
      const sandbox = await Sandbox.create({
        ...conn,
        ...(template === undefined ? {} : { template }),
      });
      process.stdout.write(`${sandbox.id}\n`);
      return 0;
    },
  },
  exec: {
    usage: 'sbx exec ID [--bash] [--timeout S] CODE|-',
    summary: "run code, streaming its output; exit with the code's exit status",
    details: `  CODE             the code to run; - reads it from stdin
  --bash           run CODE with bash in a fresh process (default: the sandbox's Python REPL,
                   where state persists between execs)
  --timeout S      interrupt the code after S seconds (it then exits 124)

stdout and stderr lines are written to sbx's stdout and stderr as they arrive.`,
    options: { bash: { type: 'boolean' }, timeout: { type: 'string' } },
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
      let timeoutMs: number | undefined;
      if (values.timeout !== undefined) {
        const seconds = Number(values.timeout);
        if (!Number.isFinite(seconds) || seconds <= 0) {
          throw new UsageError(
            `--timeout must be a positive number of seconds, got ${String(values.timeout)}`,
            'exec',
          );
        }
        timeoutMs = seconds * 1000;
      }
      const code = codeArg === '-' ? readFileSync(0, 'utf8') : codeArg;
      return execStreaming(
        id,
        code,
        { language: values.bash ? 'bash' : 'python', timeoutMs },
        conn,
      );
    },
  },
  fork: {
    usage: 'sbx fork ID -n N',
    summary: 'fork N copy-on-write children, print their ids one per line',
    details: '  -n, --count N    number of children, 1 to 32',
    options: { count: { type: 'string', short: 'n' } },
    async run(positionals, values, conn) {
      const id = onePositional('fork', positionals, 'ID');
      if (values.count === undefined) throw new UsageError('fork needs -n N', 'fork');
      const n = Number(values.count);
      if (!Number.isInteger(n))
        throw new UsageError(`-n must be a whole number, got ${String(values.count)}`, 'fork');
      const children = await (await Sandbox.connect(id, conn)).fork(n);
      process.stdout.write(children.map((c) => `${c.id}\n`).join(''));
      return 0;
    },
  },
  merge: {
    usage: 'sbx merge PARENT WINNER',
    summary: "make PARENT adopt WINNER's state (WINNER's id is gone afterwards)",
    details: "  Prints PARENT's id, which from now on drives WINNER's VM.",
    options: {},
    async run(positionals, _values, conn) {
      const [parent, winner, ...extra] = positionals;
      if (parent === undefined || winner === undefined || extra.length > 0) {
        throw new UsageError('merge needs exactly PARENT and WINNER', 'merge');
      }
      await (await Sandbox.connect(parent, conn)).merge(winner);
      process.stdout.write(`${parent}\n`);
      return 0;
    },
  },
  rm: {
    usage: 'sbx rm ID...',
    summary: 'delete sandboxes',
    details: '  Deletes every ID; reports each failure and exits 1 if there was any.',
    options: {},
    async run(positionals, _values, conn) {
      if (positionals.length === 0) throw new UsageError('rm needs at least one ID', 'rm');
      let status = 0;
      for (const id of positionals) {
        try {
          await (await Sandbox.connect(id, conn)).delete();
        } catch (err) {
          status = reportError(err, 'rm');
        }
      }
      return status;
    },
  },
  ls: {
    usage: 'sbx ls [-q | --json]',
    summary: 'list sandboxes',
    details: `  -q, --quiet      print only the ids
  --json           print the server's descriptions as JSON`,
    options: { quiet: { type: 'boolean', short: 'q' }, json: { type: 'boolean' } },
    async run(positionals, values, conn) {
      noPositionals('ls', positionals);
      const list = await Sandbox.list(conn);
      if (values.json) process.stdout.write(`${JSON.stringify(list, null, 2)}\n`);
      else if (values.quiet) process.stdout.write(list.map((s) => `${s.id}\n`).join(''));
      else process.stdout.write(table(list));
      return 0;
    },
  },
};

function globalHelp(): string {
  const width = Math.max(...Object.values(commands).map((c) => c.usage.length));
  const lines = Object.values(commands).map((c) => `  ${c.usage.padEnd(width)}  ${c.summary}`);
  return `sbx: run code in hostd sandboxes

Usage: sbx [--url URL] [--api-key KEY] COMMAND [options]

Commands:
${lines.join('\n')}

${GLOBAL_HELP}
  --version        print the version

Run 'sbx COMMAND --help' for a command's options.
`;
}

function commandHelp(name: string): string {
  const c = commands[name]!;
  return `Usage: ${c.usage}

${c.summary[0]!.toUpperCase()}${c.summary.slice(1)}.

${c.details}

${GLOBAL_HELP}
`;
}

function noPositionals(name: string, positionals: string[]): void {
  if (positionals.length > 0)
    throw new UsageError(`${name} takes no arguments, got: ${positionals.join(' ')}`, name);
}

function onePositional(name: string, positionals: string[], what: string): string {
  if (positionals.length !== 1) throw new UsageError(`${name} needs exactly one ${what}`, name);
  return positionals[0]!;
}

function table(list: SandboxInfo[]): string {
  const rows = [
    ['ID', 'TEMPLATE', 'STATE', 'BUSY', 'PARENT', 'CREATED'],
    ...list.map((s) => [
      s.id,
      s.template,
      s.state,
      s.busy ? 'yes' : 'no',
      s.parent_id ?? '-',
      s.created_at,
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]): string =>
    r
      .map((cell, i) => cell.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return rows.map((r) => `${line(r)}\n`).join('');
}

/** Streams one exec to this process's stdout and stderr; Ctrl-C interrupts the code. */
async function execStreaming(
  id: string,
  code: string,
  opts: { language: 'python' | 'bash'; timeoutMs: number | undefined },
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
  try {
    const sandbox = await Sandbox.connect(id, { ...conn, signal: abort.signal });
    let exitCode = 1;
    const events = sandbox.exec(code, {
      language: opts.language,
      signal: abort.signal,
      ...(opts.timeoutMs === undefined ? {} : { timeoutMs: opts.timeoutMs }),
    });
    for await (const event of events) {
      if (event.type === 'exit') exitCode = event.data;
      else if (event.type === 'stdout') process.stdout.write(`${event.data}\n`);
      else process.stderr.write(`${event.data}\n`);
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

function version(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

/** Splits off the command word, which may come after global options. */
function findCommand(argv: string[]): { name: string | undefined; rest: string[] } {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') break;
    if (arg === '--url' || arg === '--api-key') {
      i++;
      continue;
    }
    if (arg.startsWith('-')) continue;
    return { name: arg, rest: [...argv.slice(0, i), ...argv.slice(i + 1)] };
  }
  return { name: undefined, rest: argv };
}

/** Runs the CLI and resolves to the exit status. */
async function main(argv: string[]): Promise<number> {
  const { name, rest } = findCommand(argv);
  try {
    if (name === undefined) {
      let values: Values;
      try {
        values = parseArgs({
          args: rest,
          options: { ...GLOBAL_OPTIONS, version: { type: 'boolean' } },
          strict: true,
        }).values as Values;
      } catch (err) {
        throw new UsageError((err as Error).message);
      }
      if (values.version) {
        process.stdout.write(`${version()}\n`);
        return 0;
      }
      if (values.help) {
        process.stdout.write(globalHelp());
        return 0;
      }
      throw new UsageError('missing COMMAND');
    }
    if (name === 'help') {
      const topic = rest.find((a) => !a.startsWith('-'));
      process.stdout.write(topic && commands[topic] ? commandHelp(topic) : globalHelp());
      return 0;
    }
    const command = Object.hasOwn(commands, name) ? commands[name] : undefined;
    if (!command) throw new UsageError(`unknown command '${name}'`);
    let parsed: { values: Values; positionals: string[] };
    try {
      parsed = parseArgs({
        args: rest,
        options: { ...GLOBAL_OPTIONS, ...command.options },
        allowPositionals: true,
        strict: true,
      }) as { values: Values; positionals: string[] };
    } catch (err) {
      throw new UsageError((err as Error).message, name);
    }
    if (parsed.values.help) {
      process.stdout.write(commandHelp(name));
      return 0;
    }
    const conn: ConnectionOptions = {};
    if (typeof parsed.values.url === 'string') conn.baseUrl = parsed.values.url;
    if (typeof parsed.values['api-key'] === 'string') conn.apiKey = parsed.values['api-key'];
    return await command.run(parsed.positionals, parsed.values, conn);
  } catch (err) {
    return reportError(err, name);
  }
}

function reportError(err: unknown, name: string | undefined): number {
  if (err instanceof UsageError) {
    const help = err.command ? `sbx ${err.command} --help` : 'sbx --help';
    process.stderr.write(`sbx: ${err.message}\nRun '${help}' for usage.\n`);
    return 2;
  }
  if (isHostdError(err)) {
    process.stderr.write(`sbx: ${describeCode(err.code)}: ${err.message}\n`);
    return 1;
  }
  // Not an API error: a bad --url, an unreadable stdin, or a bug. One line unless debugging.
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`sbx: ${name ?? 'error'}: ${message}\n`);
  if (process.env.SBX_DEBUG && err instanceof Error && err.stack)
    process.stderr.write(`${err.stack}\n`);
  return 1;
}

process.exitCode = await main(process.argv.slice(2));
