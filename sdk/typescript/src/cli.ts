#!/usr/bin/env node
/**
 * `sbx`: the hostd command line, a thin layer over the SDK. Errors are one line on stderr
 * (`sbx: not found: sandbox sbx_… not found`) and exit status 1; usage mistakes exit 2;
 * `sbx exec` exits with the code's own exit status. The commands live in src/cli/.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { DEFAULT_BASE_URL, type ConnectionOptions } from './config.js';
import { UsageError, type Command, type Options, type Values } from './cli/command.js';
import { cp } from './cli/cp.js';
import { exec } from './cli/exec.js';
import { mcp } from './cli/mcp.js';
import { reportError } from './cli/report.js';
import { create, fork, ls, merge, pause, resume, rm } from './cli/sandboxes.js';
import { snapshot, snapshots, templates } from './cli/snapshots.js';

const commands: Record<string, Command> = {
  create,
  exec,
  cp,
  fork,
  merge,
  snapshot,
  snapshots,
  pause,
  resume,
  rm,
  ls,
  templates,
  mcp,
};

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

const ENVIRONMENT_HELP = `Environment: SERVICE_HOSTD_URL and SERVICE_API_KEY (as --url and --api-key),
SERVICE_REQUEST_TIMEOUT_S (default 60) and SERVICE_MAX_RETRIES (default 3) as in the SDK,
SERVICE_SBX_DEBUG=1 to print the stack trace of an unexpected failure.`;

function globalHelp(): string {
  const width = Math.max(...Object.keys(commands).map((name) => name.length));
  const lines = Object.entries(commands).map(
    ([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`,
  );
  return `sbx: run code in hostd sandboxes

Usage: sbx [--url URL] [--api-key KEY] COMMAND [options]

Commands:
${lines.join('\n')}

${GLOBAL_HELP}
  --version        print the version

${ENVIRONMENT_HELP}

Run 'sbx COMMAND --help' for a command's usage and options.
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

process.exitCode = await main(process.argv.slice(2));
