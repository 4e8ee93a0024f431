/** Liveness and metrics: the routes operators' tools call. */
import type { FastifyInstance } from 'fastify';
import type { Metrics } from '../metrics.js';

export function registerServiceRoutes(app: FastifyInstance, metrics: Metrics): void {
  app.get('/v1/healthz', async (_req, reply) => reply.type('text/plain').send('ok'));

  app.get('/metrics', async (_req, reply) =>
    reply.type(metrics.registry.contentType).send(await metrics.registry.metrics()),
  );
}
