/**
 * What every tool module shares: the argument schemas several tools take, and the context a
 * tool runs in (its session, the output limit, and the wrappers that turn the SDK's errors into
 * tool errors and data into structured results).
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js';
import type {
  CallToolResult,
  ServerNotification,
  ServerRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { describeError, isHostdError, type HostdError } from '../../errors.js';
import { Sandbox } from '../../sandbox.js';
import type { McpSession } from '../session.js';

export type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

export const sandboxId = z
  .string()
  .regex(/^sbx_[0-9a-f]{32}$/, 'a sandbox id is sbx_ followed by 32 lowercase hex digits');
export const absolutePath = z.string().startsWith('/', 'the path must be absolute (start with /)');
export const templateName = z
  .string()
  .min(1)
  .describe("Template name (list_templates shows them). Default: the server's default template.");

/** The server, session and helpers a tool module registers its tools with. */
export interface ToolContext {
  server: McpServer;
  session: McpSession;
  /** Text characters one result carries at most. */
  maxChars: number;
  /** The tool body, with the SDK's errors (and ToolInputError) returned as tool errors. */
  guarded<A>(
    fn: (args: A, extra: Extra) => Promise<CallToolResult>,
  ): (args: A, extra: Extra) => Promise<CallToolResult>;
  /** A result of a tool with an output schema: the data, and its JSON as text. */
  structured<T extends Record<string, unknown>>(data: T, isError?: boolean): CallToolResult;
  /** A new sandbox, recorded as the session's before anything else can fail. */
  create(opts: Parameters<typeof Sandbox.create>[0]): Promise<Sandbox>;
}

export function toolContext(server: McpServer, session: McpSession, maxChars: number): ToolContext {
  const toolError = (text: string): CallToolResult => ({
    content: [{ type: 'text', text }],
    isError: true,
  });
  return {
    server,
    session,
    maxChars,
    guarded: (fn) => async (args, extra) => {
      try {
        return await fn(args, extra);
      } catch (err) {
        if (extra.signal.aborted) throw err;
        if (isHostdError(err)) return toolError(explain(err));
        if (err instanceof ToolInputError) return toolError(err.message);
        session.log('warn', 'MCP tool failed unexpectedly', { err: String(err) });
        throw err;
      }
    },
    structured: (data, isError = false) => ({
      content: [{ type: 'text', text: JSON.stringify(data, null, 2) }],
      structuredContent: data,
      ...(isError ? { isError } : {}),
    }),
    async create(opts) {
      if (session.ended) throw new ToolInputError('this MCP session has ended');
      // No abort signal: a create the client gives up on still makes a sandbox on the server,
      // and the session must learn its id to clean it up.
      const sandbox = await Sandbox.create({ ...session.connection, ...opts });
      session.adopt(sandbox.id);
      return sandbox;
    },
  };
}

/** A mistake in a tool's arguments the schema cannot express; reported as a tool error. */
export class ToolInputError extends Error {}

/** The sentence of a tool description that says what happens at the session's end. */
export function endNote(session: McpSession): string {
  switch (session.sessionEnd) {
    case 'delete':
      return 'Sandboxes created in this MCP session are deleted when the session ends.';
    case 'pause':
      return 'Sandboxes created in this MCP session are paused (kept on disk) when the session ends.';
    case 'keep':
      return "Sandboxes outlive this MCP session until the server's idle timeout.";
  }
}

/** An SDK error as the model reads it: what kind, the code, the server's message, a hint. */
export function explain(err: HostdError): string {
  const hints: Record<string, string> = {
    sandbox_not_found:
      ' (list_sandboxes shows the sandboxes that exist; a merged winner lives on under the id it was merged into)',
    limit_reached: ' (delete sandboxes you no longer need with delete_sandboxes, or wait)',
    connection_error: ' (is hostd running?)',
    file_not_found: ' (list_files shows what is there)',
  };
  return `${describeError(err)} (${err.code}): ${err.message}${hints[err.code] ?? ''}`;
}
