/**
 * hostd's MCP server: the tools of tools.ts on an `McpServer` of the official SDK, one per MCP
 * session, and the stdio transport `sbx mcp` serves it on. http.ts serves the same servers over
 * Streamable HTTP.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import type { Readable, Writable } from 'node:stream';
import { SDK_VERSION } from '../version.js';
import { DEFAULT_MAX_OUTPUT_CHARS } from './content.js';
import { McpSession, type McpSessionOptions, type SessionEndReport } from './session.js';
import { endNote, registerTools } from './tools/index.js';

/** The server's name in the MCP handshake. */
export const SERVER_NAME = 'hostd';

/** An MCP server with hostd's tools, and the session whose sandboxes it tracks. */
export interface HostdMcpServer {
  server: McpServer;
  session: McpSession;
}

/**
 * A new MCP server bound to a new session. Connect it to one transport; when the transport
 * closes, end the session (`session.end()`) to clean up the sandboxes it created.
 */
export function createMcpServer(opts: McpSessionOptions = {}): HostdMcpServer {
  const maxChars = opts.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
  const session = new McpSession(opts);
  const server = new McpServer(
    { name: SERVER_NAME, title: 'hostd sandboxes', version: SDK_VERSION },
    { instructions: instructions(session), capabilities: { tools: {} } },
  );
  registerTools(server, session, maxChars);
  return { server, session };
}

/** Read by a host at the start of a session: how the tools fit together. */
function instructions(session: McpSession): string {
  return [
    'hostd runs code in isolated sandboxes (virtual machines). Each has a persistent Python',
    'REPL (variables, imports and files persist between run_code calls, as in a notebook),',
    'bash, and its own filesystem (work in /root). Start with run_code: without sandbox_id it',
    "uses this session's default sandbox, created on first use. To try alternatives from one",
    'state, fork_sandbox it, run different code in each child, merge_sandbox the best child',
    'back and delete_sandboxes the rest. Sandboxes have no network access unless created with',
    `allow_out rules (create_sandbox). ${endNote(session)} snapshot_sandbox keeps a state for`,
    'later sessions.',
  ].join(' ');
}

export interface StdioOptions extends McpSessionOptions {
  /** Default process.stdin and process.stdout. */
  stdin?: Readable;
  stdout?: Writable;
  /** Ends the session as EOF on stdin does (`sbx mcp` aborts it on SIGINT and SIGTERM). */
  signal?: AbortSignal;
}

/**
 * Serves one MCP session on stdin and stdout until stdin ends (the host closed it or went away),
 * stdout breaks, or `signal` aborts; then ends the session and resolves with what became of
 * its sandboxes. Nothing but MCP messages may be written to stdout meanwhile.
 */
export async function serveStdio(opts: StdioOptions = {}): Promise<SessionEndReport> {
  const stdin = opts.stdin ?? process.stdin;
  const stdout = opts.stdout ?? process.stdout;
  const { server, session } = createMcpServer(opts);
  const transport = new StdioServerTransport(stdin, stdout);
  let onEnd: () => void = () => undefined;
  const ended = new Promise<void>((resolve) => (onEnd = resolve));
  // The SDK's stdio transport does not watch for EOF; a host ends a stdio server by closing
  // its stdin (or by exiting, which does the same).
  stdin.once('end', onEnd);
  stdin.once('close', onEnd);
  stdout.once('error', onEnd);
  opts.signal?.addEventListener('abort', onEnd, { once: true });
  if (opts.signal?.aborted) onEnd();
  server.server.onclose = onEnd;
  await server.connect(transport);
  await ended;
  await server.close().catch(() => undefined);
  stdin.off('end', onEnd);
  stdin.off('close', onEnd);
  stdout.off('error', onEnd);
  return session.end();
}
