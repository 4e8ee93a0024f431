/**
 * The MCP tools of hostd, written once against the SDK's own client (`Sandbox`, `Files`,
 * `Snapshot`, `Template`), so that `sbx mcp` (stdio) and hostd's `/mcp` (Streamable HTTP) run the
 * same code through the same HTTP API as any other client. Descriptions are written for a model
 * to act on: what the tool does, when to use it, what each argument means, what comes back.
 * Failures come back as tool errors (`isError`), never as protocol errors, so that the model
 * sees them and can correct itself.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { McpSession } from '../session.js';
import { toolContext } from './common.js';
import { registerFileTools } from './files.js';
import { registerRunTool } from './run.js';
import { registerSandboxTools } from './sandboxes.js';

export { endNote } from './common.js';
export { DEFAULT_RUN_TIMEOUT_S } from './run.js';

/** Registers every hostd tool on `server`, bound to `session`: run_code first, the one to start with. */
export function registerTools(server: McpServer, session: McpSession, maxChars: number): void {
  const ctx = toolContext(server, session, maxChars);
  registerRunTool(ctx);
  registerSandboxTools(ctx);
  registerFileTools(ctx);
}
