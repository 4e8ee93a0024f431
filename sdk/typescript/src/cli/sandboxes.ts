/** `sbx create | fork | merge | rm | ls | pause | resume`: the lifecycle of sandboxes. */
import type { ConnectionOptions } from '../config.js';
import { Sandbox, type CreateOptions } from '../sandbox.js';
import {
  UsageError,
  keyValues,
  noPositionals,
  onePositional,
  table,
  type Command,
} from './command.js';
import { reportError } from './report.js';

export const create: Command = {
  usage: 'sbx create [--template T | --snapshot S] [--env K=V] [--allow-out RULE]',
  summary: 'create a sandbox and print its id',
  details: `  --template T        template to create from (see 'sbx templates'); default: the
                      server's default
  --snapshot S        create from snapshot S (see 'sbx snapshots') instead
  --env NAME=VALUE    environment of every exec of the sandbox (repeatable)
  --allow-out RULE    allow outbound connections (repeatable): example.com, example.com:443,
                      *.example.com, 203.0.113.0/24, * (any public address),
                      host.hostd.internal:PORT; without it the sandbox has no network`,
  options: {
    template: { type: 'string', short: 't' },
    snapshot: { type: 'string' },
    env: { type: 'string', multiple: true },
    'allow-out': { type: 'string', multiple: true },
  },
  async run(positionals, values, conn) {
    noPositionals('create', positionals);
    const opts: CreateOptions = { ...conn };
    if (typeof values.template === 'string') opts.template = values.template;
    if (typeof values.snapshot === 'string') opts.snapshot = values.snapshot;
    const env = keyValues('create', '--env', values.env as string[] | undefined);
    if (env !== undefined) opts.env = env;
    const allowOut = values['allow-out'] as string[] | undefined;
    if (allowOut !== undefined) opts.network = { allowOut };
    const sandbox = await Sandbox.create(opts);
    process.stdout.write(`${sandbox.id}\n`);
    return 0;
  },
};

export const fork: Command = {
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
};

export const merge: Command = {
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
};

/** A command that does one thing to each of several sandboxes, reporting each failure. */
function eachSandbox(
  name: string,
  summary: string,
  details: string,
  action: (sandbox: Sandbox) => Promise<void>,
): Command {
  return {
    usage: `sbx ${name} ID...`,
    summary,
    details,
    options: {},
    async run(positionals, _values, conn: ConnectionOptions) {
      if (positionals.length === 0) throw new UsageError(`${name} needs at least one ID`, name);
      let status = 0;
      for (const id of positionals) {
        try {
          await action(await Sandbox.connect(id, conn));
        } catch (err) {
          status = reportError(err, name);
        }
      }
      return status;
    },
  };
}

export const rm = eachSandbox(
  'rm',
  'delete sandboxes',
  '  Deletes every ID; reports each failure and exits 1 if there was any.',
  (s) => s.delete(),
);

export const pause = eachSandbox(
  'pause',
  'write sandboxes to disk and stop their VMs (their next use resumes them)',
  '  Pauses every ID; reports each failure and exits 1 if there was any.',
  (s) => s.pause(),
);

export const resume = eachSandbox(
  'resume',
  'start paused sandboxes again now',
  '  Resumes every ID; reports each failure and exits 1 if there was any.',
  (s) => s.resume(),
);

export const ls: Command = {
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
    else {
      process.stdout.write(
        table([
          ['ID', 'TEMPLATE', 'STATE', 'BUSY', 'PARENT', 'CREATED'],
          ...list.map((s) => [
            s.id,
            s.template,
            s.state,
            s.busy ? 'yes' : 'no',
            s.parent_id ?? '-',
            s.created_at,
          ]),
        ]),
      );
    }
    return 0;
  },
};
