/** `sbx snapshot | snapshots | templates`: what sandboxes are created from. */
import { Sandbox } from '../sandbox.js';
import { Snapshot } from '../snapshot.js';
import { Template } from '../template.js';
import {
  UsageError,
  humanBytes,
  noPositionals,
  onePositional,
  table,
  type Command,
} from './command.js';
import { reportError } from './report.js';

export const snapshot: Command = {
  usage: 'sbx snapshot ID',
  summary: "save a sandbox's whole state as a snapshot, print the snapshot's id",
  details: `  The sandbox keeps running. 'sbx create --snapshot SNAP' makes sandboxes in that state.`,
  options: {},
  async run(positionals, _values, conn) {
    const id = onePositional('snapshot', positionals, 'ID');
    const snap = await (await Sandbox.connect(id, conn)).snapshot();
    process.stdout.write(`${snap.id}\n`);
    return 0;
  },
};

export const snapshots: Command = {
  usage: 'sbx snapshots [-q | --json] | sbx snapshots rm SNAP...',
  summary: 'list snapshots, newest first, or delete some',
  details: `  -q, --quiet      print only the ids
  --json           print the server's descriptions as JSON
  rm SNAP...       delete snapshots; sandboxes made from them keep running`,
  options: { quiet: { type: 'boolean', short: 'q' }, json: { type: 'boolean' } },
  async run(positionals, values, conn) {
    if (positionals[0] === 'rm') {
      const ids = positionals.slice(1);
      if (ids.length === 0)
        throw new UsageError('snapshots rm needs at least one SNAP', 'snapshots');
      let status = 0;
      for (const id of ids) {
        try {
          await (await Snapshot.get(id, conn)).delete();
        } catch (err) {
          status = reportError(err, 'snapshots');
        }
      }
      return status;
    }
    noPositionals('snapshots', positionals);
    const list = await Snapshot.list(conn);
    if (values.json) {
      process.stdout.write(`${JSON.stringify(list, null, 2)}\n`);
    } else if (values.quiet) {
      process.stdout.write(list.map((s) => `${s.id}\n`).join(''));
    } else {
      process.stdout.write(
        table([
          ['ID', 'SOURCE', 'TEMPLATE', 'SIZE', 'SANDBOXES', 'CREATED'],
          ...list.map(({ info: s }) => [
            s.snapshot_id,
            s.source_sandbox_id,
            s.template,
            humanBytes(s.size_bytes),
            String(s.sandboxes),
            s.created_at,
          ]),
        ]),
      );
    }
    return 0;
  },
};

export const templates: Command = {
  usage: 'sbx templates [-q | --json]',
  summary: 'list templates (the first is the default)',
  details: `  -q, --quiet      print only the names
  --json           print the server's descriptions as JSON (packages, preloaded modules, ...)`,
  options: { quiet: { type: 'boolean', short: 'q' }, json: { type: 'boolean' } },
  async run(positionals, values, conn) {
    noPositionals('templates', positionals);
    const list = await Template.list(conn);
    if (values.json) {
      process.stdout.write(`${JSON.stringify(list, null, 2)}\n`);
    } else if (values.quiet) {
      process.stdout.write(list.map((t) => `${t.name}\n`).join(''));
    } else {
      process.stdout.write(
        table([
          ['NAME', 'STATE', 'MEMORY', 'VCPUS', 'DISK', 'POOL', 'DESCRIPTION'],
          ...list.map((t) => [
            t.default ? `${t.name} (default)` : t.name,
            t.state,
            `${t.memory_mib} MiB`,
            String(t.vcpus),
            `${t.disk_mib} MiB`,
            String(t.pool_size),
            t.description,
          ]),
        ]),
      );
    }
    return 0;
  },
};
