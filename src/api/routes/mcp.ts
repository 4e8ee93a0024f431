/**
 * `/mcp`: hostd's MCP server over Streamable HTTP (docs/mcp.md). The tools are the TypeScript
 * SDK's (sdk/typescript/src/mcp), the same `sbx mcp` serves on stdio; here they drive this
 * hostd through its own HTTP API on loopback, with the caller's key, so that an MCP tool call
 * takes exactly the path (auth, validation, limits, errors) of any other client's request. The
 * server hook authenticates `/mcp` like `/v1`; this module only hands requests to the endpoint.
 */
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { McpHttpEndpoint, SessionEndAction } from '../../../sdk/typescript/src/mcp/index.js';
import { bearerToken } from '../auth.js';

export const MCP_ROUTE = '/mcp';

export interface McpRouteOptions {
  /** What a session's end does to the sandboxes it created (SERVICE_MCP_SESSION_END). */
  sessionEnd: SessionEndAction;
  /** Seconds a session with no request open lives on; 0 never ends (SERVICE_MCP_SESSION_IDLE_S). */
  idleTimeoutS: number;
  logger: Logger;
}

export function registerMcpRoutes(app: FastifyInstance, opts: McpRouteOptions): void {
  const log = opts.logger.child({ component: 'mcp' });
  // The MCP SDK and zod take about half a second to load, which hostd's start would wait for
  // before it serves anything: they load once hostd listens, in the background; a request to
  // /mcp that comes before the load ends waits for it.
  let loading: Promise<McpHttpEndpoint> | null = null;
  const endpoint = (): Promise<McpHttpEndpoint> =>
    (loading ??= import('../../../sdk/typescript/src/mcp/index.js').then(
      ({ McpHttpEndpoint }) =>
        new McpHttpEndpoint({
          sessionEnd: opts.sessionEnd,
          idleTimeoutMs: opts.idleTimeoutS * 1000,
          log: (level, message, fields) => log[level](fields ?? {}, message),
        }),
    ));
  app.addHook('onListen', async () => {
    void endpoint().catch((err: unknown) => log.error({ err }, 'could not load the MCP server'));
  });
  // On shutdown, sessions close and their sandboxes stay: hostd pauses every sandbox then, and
  // they resume under the same ids after the restart.
  app.addHook('onClose', async () => {
    if (loading) await (await loading.catch(() => null))?.close();
  });

  app.route({
    method: ['GET', 'POST', 'DELETE'],
    url: MCP_ROUTE,
    handler: async (req, reply) => {
      const mcp = await endpoint();
      const connection = {
        baseUrl: ownUrl(app),
        // The key the auth hook accepted, or none when auth is off ('' overrides the SDK's
        // SERVICE_API_KEY default, which is not ours to use).
        apiKey: bearerToken(req.headers.authorization) ?? '',
      };
      // The MCP transport writes the response itself (an SSE stream or JSON).
      reply.hijack();
      await mcp.handle(req.raw, reply.raw, req.body, connection);
    },
  });
}

/** hostd's own API on loopback, whatever address it listens on. */
function ownUrl(app: FastifyInstance): string {
  const { address, port, family } = app.server.address() as AddressInfo;
  if (address === '0.0.0.0') return `http://127.0.0.1:${port}`;
  if (address === '::') return `http://[::1]:${port}`;
  return family === 'IPv6' ? `http://[${address}]:${port}` : `http://${address}:${port}`;
}
