/**
 * envd: processes and the filesystem over Connect RPC (`/process.Process/*`,
 * `/filesystem.Filesystem/*`) and plain HTTP `/files` (docs/e2b.md). Owned by the e2b-envd work;
 * a stub until then: every call answers `route_not_found` (Connect: `unimplemented`) from the front's
 * not-found handler.
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

export function registerEnvdRoutes(_app: FastifyInstance, _ctx: E2bContext): void {
  // Filled by e2b-envd.
}
