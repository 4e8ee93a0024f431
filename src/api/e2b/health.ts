/**
 * envd's `GET /health`, which `sandbox.isRunning()` calls and every SDK probes when a stream
 * breaks: 204 while the sandbox runs; for a sandbox that is killed, expired, paused or unknown,
 * the front's hook has already answered 502 `{"message": "The sandbox was not found",
 * "sandboxId", "code": 502}` (E2B's proxy), which the SDKs read as "not running". No token: the
 * SDK's probe must work whatever happened to the sandbox.
 */
import type { FastifyInstance } from 'fastify';
import type { E2bContext } from './context.js';

export function registerHealthRoute(app: FastifyInstance, _ctx: E2bContext): void {
  app.get('/health', { config: { e2bToken: 'none' } }, async (_req, reply) =>
    reply.code(204).send(),
  );
}
