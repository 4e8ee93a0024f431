/**
 * The code interpreter: `POST /execute` (NDJSON) and `/contexts` (docs/e2b.md). Owned by the
 * e2b-interp work; a stub until then: every call answers `route_not_found` from the front's not-found handler.
 *
 * `app` is the interpreter scope of the front (server.ts): every route registered on it serves
 * `E2b-Sandbox-Port: 49999`, its sandbox is looked up and authorized before the handler runs
 * (`ctx.sandboxOf(req)`; policy `traffic` by default: `X-Access-Token` or
 * `E2B-Traffic-Access-Token`), and its errors render as `{code, message}` JSON. Parser:
 * `application/json` (empty = undefined: the SDK sends that content type on GET and DELETE).
 */
import type { FastifyInstance } from 'fastify';
import type { E2bContext } from './context.js';

export function registerInterpreterRoutes(_app: FastifyInstance, _ctx: E2bContext): void {
  // Filled by e2b-interp.
}
