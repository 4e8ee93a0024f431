/**
 * The tools of a sandbox's life: create (from a template or a snapshot), fork, merge, snapshot,
 * list and delete, keeping the session's record of the sandboxes it owns up to date.
 */
import { z } from 'zod';
import { isHostdError } from '../../errors.js';
import { Sandbox } from '../../sandbox.js';
import { Snapshot } from '../../snapshot.js';
import { Template } from '../../template.js';
import type { SandboxInfo, SnapshotInfo } from '../../types.js';
import type { McpSession } from '../session.js';
import {
  ToolInputError,
  endNote,
  explain,
  sandboxId,
  templateName,
  type ToolContext,
} from './common.js';

const allowOut = z
  .array(z.string().min(1))
  .max(256)
  .describe(
    'Outbound network access; without it the sandbox has no network at all. Each rule is one of: ' +
      '"example.com" (that host, any port), "example.com:443", "*.example.com" (its subdomains), ' +
      '"203.0.113.0/24" (an address range), "*" (any public address), "host.hostd.internal:PORT" ' +
      "(a port of the host machine, e.g. a local model server). pip, git, curl and Python's " +
      'requests work through hostd\'s proxy. Example: ["pypi.org", "files.pythonhosted.org"].',
  );

/** Rows list_sandboxes and list_snapshots return at most: a busy server has hundreds. */
const MAX_LISTED = 100;

const SNAPSHOT = {
  snapshot_id: z.string(),
  source_sandbox_id: z.string(),
  template: z.string(),
  size_bytes: z.number(),
  created_at: z.string(),
};

export function registerSandboxTools(ctx: ToolContext): void {
  const { server, session, guarded, structured, create } = ctx;
  server.registerTool(
    'create_sandbox',
    {
      title: 'Create a sandbox',
      description:
        'Create a new sandbox: an isolated virtual machine with a persistent Python REPL ' +
        '(variables, imports and files persist between run_code calls, as in a notebook), bash, ' +
        'and its own filesystem (work in /root). Returns its sandbox_id for the other tools. ' +
        'You rarely need this: run_code creates a sandbox when it has none. Use it for a ' +
        'sandbox with network access (allow_out), another template, environment variables, or ' +
        'a copy of a snapshot (snapshot_id). ' +
        endNote(session),
      inputSchema: {
        template: templateName.optional(),
        snapshot_id: z
          .string()
          .regex(/^snap_[0-9a-z]+$/, 'a snapshot id starts with snap_')
          .optional()
          .describe(
            'Start from this snapshot (from snapshot_sandbox or list_snapshots) instead of a ' +
              'template: the new sandbox has its Python variables and files.',
          ),
        allow_out: allowOut.optional(),
        env: z
          .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string())
          .optional()
          .describe("Environment variables of every command and of Python's os.environ."),
      },
      outputSchema: {
        sandbox_id: z.string(),
        template: z.string(),
        snapshot_id: z.string().nullable(),
        allow_out: z.array(z.string()),
      },
      annotations: { readOnlyHint: false, destructiveHint: false, openWorldHint: false },
    },
    guarded(async (args) => {
      if (args.template !== undefined && args.snapshot_id !== undefined) {
        throw new ToolInputError('give either template or snapshot_id, not both');
      }
      const sandbox = await create({
        template: args.template,
        snapshot: args.snapshot_id,
        env: args.env,
        network: args.allow_out === undefined ? undefined : { allowOut: args.allow_out },
      });
      const info = await sandbox.info();
      return structured({
        sandbox_id: sandbox.id,
        template: info.template,
        snapshot_id: info.snapshot_id ?? null,
        allow_out: info.network?.allow_out ?? [],
      });
    }),
  );

  server.registerTool(
    'fork_sandbox',
    {
      title: 'Fork a sandbox',
      description:
        'Fork a sandbox into n copy-on-write children, each starting from its whole current ' +
        'state: Python variables and imports, files, running processes. Use it to try ' +
        'alternatives from one state in parallel: run different code in each child with ' +
        'run_code, keep the best with merge_sandbox, and delete the others with ' +
        'delete_sandboxes. The parent is not changed; later changes in one sandbox are ' +
        "invisible to the others. Returns the children's ids.",
      inputSchema: {
        sandbox_id: sandboxId.describe('The sandbox to fork (the parent).'),
        n: z.number().int().min(1).max(32).describe('How many children, 1 to 32.'),
      },
      outputSchema: { parent_id: z.string(), children: z.array(z.string()) },
      annotations: { readOnlyHint: false, destructiveHint: false, openWorldHint: false },
    },
    guarded(async (args, extra) => {
      const parent = await session.connect(args.sandbox_id, extra.signal);
      if (session.ended) throw new ToolInputError('this MCP session has ended');
      const children = await parent.fork(args.n);
      session.adopt(...children.map((c) => c.id));
      return structured({ parent_id: parent.id, children: children.map((c) => c.id) });
    }),
  );

  server.registerTool(
    'merge_sandbox',
    {
      title: 'Merge a winner into a sandbox',
      description:
        "Make sandbox_id take over winner_id's whole state (usually the fork child that did " +
        "best): afterwards sandbox_id has the winner's variables, files and processes, " +
        "sandbox_id's previous state is destroyed, and winner_id no longer exists (use " +
        'sandbox_id from now on). Other sandboxes, such as the other children, are not ' +
        'touched: delete them with delete_sandboxes.',
      inputSchema: {
        sandbox_id: sandboxId.describe(
          "The sandbox that lives on with the winner's state (usually the parent).",
        ),
        winner_id: sandboxId.describe('The sandbox whose state is kept; its id goes away.'),
      },
      outputSchema: { sandbox_id: z.string(), merged: z.string() },
      annotations: { readOnlyHint: false, destructiveHint: true, openWorldHint: false },
    },
    guarded(async (args, extra) => {
      const target = await session.connect(args.sandbox_id, extra.signal);
      await target.merge(args.winner_id);
      if (session.defaultSandbox?.id === args.winner_id) {
        // The default's state lives on under the target's id.
        session.defaultSandbox = { ...session.defaultSandbox, id: target.id };
        session.owned.delete(args.winner_id);
      } else {
        session.forget(args.winner_id);
      }
      return structured({ sandbox_id: target.id, merged: args.winner_id });
    }),
  );

  server.registerTool(
    'snapshot_sandbox',
    {
      title: 'Snapshot a sandbox',
      description:
        "Save a sandbox's whole state (Python variables and imports, files) as a snapshot. " +
        'Snapshots outlive this session and sandboxes: create_sandbox with snapshot_id starts ' +
        'new sandboxes from one, any number of times. The sandbox keeps running unchanged.',
      inputSchema: { sandbox_id: sandboxId },
      outputSchema: SNAPSHOT,
      annotations: { readOnlyHint: false, destructiveHint: false, openWorldHint: false },
    },
    guarded(async (args, extra) => {
      const sandbox = await session.connect(args.sandbox_id, extra.signal);
      const snapshot = await sandbox.snapshot();
      return structured(snapshotOf(snapshot.info));
    }),
  );

  server.registerTool(
    'list_sandboxes',
    {
      title: 'List sandboxes',
      description:
        'List the sandboxes on the server: id, state (ready; paused: on disk, resumed by its ' +
        'next use; failed), template, the sandbox it was forked from, when it was last used, ' +
        "whether this session created it, and which one is this session's default. This " +
        `session's own come first, then the most recently used; at most ${MAX_LISTED}.`,
      inputSchema: {},
      outputSchema: {
        sandboxes: z.array(
          z.object({
            sandbox_id: z.string(),
            state: z.string(),
            template: z.string(),
            parent_id: z.string().nullable(),
            created_at: z.string(),
            last_used_at: z.string(),
            busy: z.boolean(),
            this_session: z.boolean(),
            default: z.boolean(),
          }),
        ),
        total: z.number().describe('sandboxes on the server, listed or not'),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    guarded(async (_args, extra) => {
      const list = await Sandbox.list({ ...session.connection, signal: extra.signal });
      const rows = list
        .map((s) => sandboxOf(s, session))
        .sort(
          (a, b) =>
            Number(b.this_session) - Number(a.this_session) ||
            b.last_used_at.localeCompare(a.last_used_at),
        );
      return structured({ sandboxes: rows.slice(0, MAX_LISTED), total: rows.length });
    }),
  );

  server.registerTool(
    'delete_sandboxes',
    {
      title: 'Delete sandboxes',
      description:
        'Delete sandboxes and everything in them, for example the fork children that lost. ' +
        'Their ids stop working. Snapshots made from them stay.',
      inputSchema: {
        sandbox_ids: z.array(sandboxId).min(1).max(64).describe('The sandboxes to delete.'),
      },
      outputSchema: {
        deleted: z.array(z.string()),
        not_found: z.array(z.string()),
        failed: z.array(z.object({ sandbox_id: z.string(), error: z.string() })),
      },
      annotations: {
        readOnlyHint: false,
        destructiveHint: true,
        idempotentHint: true,
        openWorldHint: false,
      },
    },
    guarded(async (args, extra) => {
      const result = {
        deleted: [] as string[],
        not_found: [] as string[],
        failed: [] as { sandbox_id: string; error: string }[],
      };
      for (const id of new Set(args.sandbox_ids)) {
        try {
          await (await session.connect(id, extra.signal)).delete({ signal: extra.signal });
          result.deleted.push(id);
          session.forget(id);
        } catch (err) {
          if (extra.signal.aborted) throw err;
          if (isHostdError(err, 'sandbox_not_found')) {
            result.not_found.push(id);
            session.forget(id);
          } else {
            result.failed.push({
              sandbox_id: id,
              error: isHostdError(err) ? explain(err) : String(err),
            });
          }
        }
      }
      return structured(result, result.not_found.length + result.failed.length > 0);
    }),
  );

  server.registerTool(
    'list_snapshots',
    {
      title: 'List snapshots',
      description:
        "List the snapshots on the server, newest first: their ids (for create_sandbox's " +
        'snapshot_id), the sandbox and template each was taken from, its size and when; at ' +
        `most ${MAX_LISTED}.`,
      inputSchema: {},
      outputSchema: { snapshots: z.array(z.object(SNAPSHOT)), total: z.number() },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    guarded(async (_args, extra) => {
      const snapshots = await Snapshot.list({ ...session.connection, signal: extra.signal });
      return structured({
        snapshots: snapshots.slice(0, MAX_LISTED).map((s) => snapshotOf(s.info)),
        total: snapshots.length,
      });
    }),
  );

  server.registerTool(
    'list_templates',
    {
      title: 'List templates',
      description:
        'List the templates sandboxes are created from (their Python libraries and tools, ' +
        'memory, CPUs), the default one first, and whether each is ready.',
      inputSchema: {},
      outputSchema: {
        templates: z.array(
          z.object({
            name: z.string(),
            default: z.boolean(),
            state: z.string(),
            description: z.string(),
            memory_mib: z.number(),
            vcpus: z.number(),
            preloaded_modules: z.array(z.string()),
            error: z.string().nullable(),
          }),
        ),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    guarded(async (_args, extra) => {
      const templates = await Template.list({ ...session.connection, signal: extra.signal });
      return structured({
        templates: templates.map((t) => ({
          name: t.name,
          default: t.default,
          state: t.state,
          description: t.description,
          memory_mib: t.memory_mib,
          vcpus: t.vcpus,
          preloaded_modules: t.preload,
          error: t.error,
        })),
      });
    }),
  );
}

function snapshotOf(s: SnapshotInfo) {
  return {
    snapshot_id: s.snapshot_id,
    source_sandbox_id: s.source_sandbox_id,
    template: s.template,
    size_bytes: s.size_bytes,
    created_at: s.created_at,
  };
}

function sandboxOf(s: SandboxInfo, session: McpSession) {
  return {
    sandbox_id: s.id,
    state: s.state,
    template: s.template,
    parent_id: s.parent_id,
    created_at: s.created_at,
    last_used_at: s.last_used_at,
    busy: s.busy,
    this_session: session.owned.has(s.id),
    default: session.defaultSandbox?.id === s.id,
  };
}
