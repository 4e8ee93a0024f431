/**
 * `@hostd/sdk/mcp`: hostd's MCP server (tools to create, run, fork, merge, snapshot and delete
 * sandboxes and to move files), over stdio (`sbx mcp`) or Streamable HTTP (hostd's `/mcp`, or
 * any Node HTTP server). A separate entry point, so that `@hostd/sdk` itself loads nothing of MCP.
 *
 * @example
 * import { serveStdio } from '@hostd/sdk/mcp';
 * await serveStdio({ sessionEnd: 'delete' }); // until stdin ends
 */
export { createMcpServer, serveStdio, SERVER_NAME } from './server.js';
export type { HostdMcpServer, StdioOptions } from './server.js';
export { McpHttpEndpoint, DEFAULT_SESSION_IDLE_MS } from './http.js';
export type { McpHttpOptions } from './http.js';
export { McpSession, SESSION_END_ACTIONS } from './session.js';
export type { McpLog, McpSessionOptions, SessionEndAction, SessionEndReport } from './session.js';
export { DEFAULT_MAX_OUTPUT_CHARS, MAX_IMAGES } from './content.js';
export { DEFAULT_RUN_TIMEOUT_S } from './tools/index.js';
