/**
 * `run_code`: code in a sandbox, with what a notebook shows coming back as MCP content
 * (content.ts). Without a sandbox id it uses the session's default sandbox, created on first
 * use, so that a model that omits the id still keeps its state from one call to the next.
 */
import { z } from 'zod';
import { isHostdError } from '../../errors.js';
import type { Sandbox } from '../../sandbox.js';
import { RunContent, clip } from '../content.js';
import {
  ToolInputError,
  explain,
  sandboxId,
  templateName,
  type Extra,
  type ToolContext,
} from './common.js';

/** Seconds a run_code call may take when it names no timeout. */
export const DEFAULT_RUN_TIMEOUT_S = 300;

export function registerRunTool(ctx: ToolContext): void {
  const { server, session, maxChars, guarded, create } = ctx;
  server.registerTool(
    'run_code',
    {
      title: 'Run Python or bash code',
      description:
        'Run Python or bash code in a sandbox and get back what a notebook would show: stdout ' +
        'and stderr as text in the order printed, matplotlib figures and other images as ' +
        'images, pandas DataFrames as text tables (with their HTML for display). Python runs ' +
        "in the sandbox's persistent REPL, like a notebook cell: variables, imports and " +
        'functions from earlier calls stay defined, and the value of the last expression is ' +
        'shown. bash runs `bash -c CODE` in a fresh process each time (files persist, shell ' +
        'variables do not). An uncaught exception or a non-zero exit status comes back as an ' +
        "error with the traceback. Without sandbox_id the code runs in this session's default " +
        'sandbox, created on first use; the result names the sandbox it ran in. Output over ' +
        `${maxChars} characters is cut in the middle: print summaries, not whole datasets. ` +
        'list_templates tells which libraries each template has.',
      inputSchema: {
        code: z
          .string()
          .min(1)
          .describe(
            'The code. Python: statements as in a notebook cell (top-level await works). ' +
              'bash: a script for bash -c.',
          ),
        language: z
          .enum(['python', 'bash'])
          .default('python')
          .describe('python (default): the persistent REPL. bash: a fresh bash process.'),
        sandbox_id: sandboxId
          .optional()
          .describe(
            "The sandbox to run in, from an earlier result. Omit it to use this session's " +
              'default sandbox (created on first use).',
          ),
        template: templateName
          .optional()
          .describe(
            'Without sandbox_id only: the template of the default sandbox. A template other ' +
              "than the current default sandbox's creates a new default sandbox from it.",
          ),
        timeout_s: z
          .number()
          .positive()
          .max(86400)
          .default(DEFAULT_RUN_TIMEOUT_S)
          .describe(
            `Interrupt the code after this many seconds (exit code 124). Default ${DEFAULT_RUN_TIMEOUT_S}.`,
          ),
      },
      annotations: { readOnlyHint: false, destructiveHint: true, openWorldHint: true },
    },
    guarded(async (args, extra) => {
      const notes: string[] = [];
      let sandbox: Sandbox;
      let created: string | undefined;
      if (args.sandbox_id !== undefined) {
        if (args.template !== undefined) {
          throw new ToolInputError(
            'template applies only without sandbox_id (to the default sandbox); drop one of them',
          );
        }
        sandbox = await session.connect(args.sandbox_id, extra.signal);
      } else {
        // One at a time: calls a model makes in parallel in a new session share one default
        // sandbox instead of each creating its own.
        ({ sandbox, created } = await session.serially(async () => {
          const current = session.defaultSandbox;
          if (current && (args.template === undefined || args.template === current.template)) {
            try {
              return { sandbox: await session.connect(current.id, extra.signal) };
            } catch (err) {
              if (!isHostdError(err, 'not_found')) throw err;
              notes.push(`the default sandbox ${current.id} is gone (${err.message})`);
              // A lost sandbox still has a record to delete at the session's end.
              if (isHostdError(err, 'sandbox_lost')) session.defaultSandbox = undefined;
              else session.forget(current.id);
            }
          }
          const made = await create({ template: args.template });
          const template = (await made.info()).template;
          session.defaultSandbox = { id: made.id, template };
          return { sandbox: made, created: template };
        }));
      }
      const content = new RunContent(maxChars, sandbox.id);
      const progress = progressReporter(extra);
      let exitCode = -1;
      try {
        for await (const event of sandbox.exec(args.code, {
          language: args.language,
          timeoutMs: args.timeout_s * 1000,
          ...(args.language === 'python' ? { display: true } : {}),
          signal: extra.signal,
        })) {
          if (event.type === 'exit') {
            exitCode = event.data;
          } else if (event.type === 'display') {
            content.display(event.data);
          } else if (event.type === 'stdout' || event.type === 'stderr') {
            content.text(`${event.data}\n`);
            progress(event.data);
          }
        }
      } catch (err) {
        if (extra.signal.aborted || !isHostdError(err, 'executor_error')) throw err;
        // The sandbox failed mid-exec: show what it printed before, and why.
        return {
          content: content.finish(`[${explain(err)}; sandbox ${sandbox.id}]`),
          isError: true,
        };
      }
      const where =
        created === undefined
          ? `sandbox ${sandbox.id}`
          : `new sandbox ${sandbox.id} (template ${created}), now this session's default: later calls without sandbox_id run there`;
      const status = [
        ...notes.map((n) => `[${n}]`),
        `[${content.anyOutput ? '' : 'no output; '}${where}; ${exitNote(exitCode, args.timeout_s)}]`,
      ].join('\n');
      return { content: content.finish(status), ...(exitCode !== 0 ? { isError: true } : {}) };
    }),
  );
}

/** What an exit code means, for the status line. */
function exitNote(code: number, timeoutS: number): string {
  switch (code) {
    case 0:
      return 'exit code 0';
    case 124:
      return `exit code 124: interrupted after the ${timeoutS} s timeout (raise timeout_s for longer runs)`;
    case 125:
      return "exit code 125: interrupted, the output reached the server's limit";
    case 130:
      return 'exit code 130: interrupted';
    default:
      return `exit code ${code}`;
  }
}

/**
 * Sends `notifications/progress` with the latest output line, at most every 250 ms, when the
 * client asked for progress (a progress token): a host can show a long run's output live, and
 * a client that resets its timeout on progress does not give up on it.
 */
function progressReporter(extra: Extra): (line: string) => void {
  const token = extra._meta?.progressToken;
  if (token === undefined) return () => undefined;
  let lines = 0;
  let last = 0;
  return (line) => {
    lines += 1;
    const now = Date.now();
    if (now - last < 250) return;
    last = now;
    extra
      .sendNotification({
        method: 'notifications/progress',
        params: { progressToken: token, progress: lines, message: clip(line, 200) },
      })
      .catch(() => undefined);
  };
}
