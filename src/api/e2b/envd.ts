/**
 * envd: processes and the filesystem over Connect RPC (`/process.Process/*`,
 * `/filesystem.Filesystem/*`) and plain HTTP `/files` (docs/e2b.md): what E2B's
 * `sandbox.commands` and `sandbox.files` call, as translations of core's processes and files
 * services (envd-process.ts, envd-filesystem.ts, envd-files.ts; the Connect codec is
 * connect.ts, envd's messages envd-messages.ts).
 *
 * `app` is the envd scope of the front (server.ts): every route registered on it serves
 * `E2b-Sandbox-Port: 49983` (and headerless `/files`, for signed URLs), its sandbox is looked up
 * and authorized before the handler runs (`ctx.sandboxOf(req)`; policy per route in
 * `config.e2bToken`, default `access`), and its errors render as Connect errors on RPC paths and
 * as envd's `{code, message}` elsewhere. Parsers: `application/json` (parsed; empty = undefined),
 * `application/connect+json` (a Buffer: the enveloped request), anything else unparsed (the
 * request stream is the body).
 */
import type { FastifyInstance } from 'fastify';
import type { E2bContext } from './context.js';
import { registerFilesRoutes } from './envd-files.js';
import { registerFilesystemRoutes } from './envd-filesystem.js';
import { registerProcessRoutes } from './envd-process.js';

export function registerEnvdRoutes(app: FastifyInstance, ctx: E2bContext): void {
  registerProcessRoutes(app, ctx);
  registerFilesystemRoutes(app, ctx);
  registerFilesRoutes(app, ctx);
}
