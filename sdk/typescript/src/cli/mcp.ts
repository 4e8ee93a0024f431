/**
 * `sbx mcp`: hostd's MCP server on stdin and stdout, for an MCP host (a desktop assistant, an
 * IDE, an agent framework) to start as a subprocess. It serves until the host closes stdin, then
 * deletes (or pauses) the sandboxes the session created. stdout carries MCP messages only;
 * what sbx has to say goes to stderr.
 */
import { resolveConfig } from '../config.js';
import { DEFAULT_MAX_OUTPUT_CHARS } from '../mcp/content.js';
import { SESSION_END_ACTIONS, type SessionEndAction } from '../mcp/session.js';
import { UsageError, noPositionals, type Command } from './command.js';

export const mcp: Command = {
  usage: 'sbx mcp [--session-end delete|pause|keep] [--max-output-chars N]',
  summary: 'serve hostd as an MCP server on stdio, for agents in MCP hosts',
  details: `  --session-end ACTION    what happens to the sandboxes this session created when the
                          host closes stdin (or sbx gets SIGINT/SIGTERM): delete (default),
                          pause (kept on disk, resumed by their next use), keep (left to
                          hostd's idle timeout)
  --max-output-chars N    text characters one tool result carries at most (default ${DEFAULT_MAX_OUTPUT_CHARS});
                          longer output is cut in the middle

The host starts 'sbx mcp' and talks MCP over its stdin and stdout; sbx reaches hostd by
--url / SERVICE_HOSTD_URL with --api-key / SERVICE_API_KEY. An MCP host's configuration:

  {"mcpServers": {"hostd": {"command": "sbx", "args": ["mcp"],
    "env": {"SERVICE_HOSTD_URL": "http://127.0.0.1:7070", "SERVICE_API_KEY": "..."}}}}

hostd also serves the same tools over Streamable HTTP at /mcp.`,
  options: {
    'session-end': { type: 'string' },
    'max-output-chars': { type: 'string' },
  },
  async run(positionals, values, conn) {
    noPositionals('mcp', positionals);
    const end = (values['session-end'] as string | undefined) ?? 'delete';
    if (!SESSION_END_ACTIONS.includes(end as SessionEndAction)) {
      throw new UsageError(`--session-end must be delete, pause or keep, got ${end}`, 'mcp');
    }
    const rawMax = values['max-output-chars'] as string | undefined;
    const maxOutputChars = rawMax === undefined ? undefined : Number(rawMax);
    if (
      maxOutputChars !== undefined &&
      (!Number.isInteger(maxOutputChars) || maxOutputChars < 1000)
    ) {
      throw new UsageError(
        `--max-output-chars must be a whole number >= 1000, got ${rawMax}`,
        'mcp',
      );
    }
    // A bad URL is a mistake to report now, not on the first tool call.
    const config = resolveConfig(conn);
    const stop = new AbortController();
    const onSignal = (): void => stop.abort();
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    process.stderr.write(`sbx mcp: serving hostd at ${config.baseUrl} over stdio\n`);
    try {
      // Loaded here: the MCP SDK and zod cost every other sbx command their start-up time.
      const { serveStdio } = await import('../mcp/server.js');
      const report = await serveStdio({
        connection: conn,
        sessionEnd: end as SessionEndAction,
        ...(maxOutputChars === undefined ? {} : { maxOutputChars }),
        signal: stop.signal,
        log: (level, message, fields) =>
          process.stderr.write(
            `sbx mcp: ${level}: ${message}${fields ? ` ${JSON.stringify(fields)}` : ''}\n`,
          ),
      });
      const what = { delete: 'deleted', pause: 'paused', keep: 'kept' }[report.action];
      process.stderr.write(
        `sbx mcp: session ended: ${report.done.length} sandbox(es) ${what}` +
          (report.failed.length > 0 ? `, ${report.failed.length} failed` : '') +
          '\n',
      );
      return report.failed.length > 0 ? 1 : 0;
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      // Nothing more is read: let the process exit even if the host keeps the pipe open.
      process.stdin.destroy();
    }
  },
};
