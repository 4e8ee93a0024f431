/** Templates: what hostd serves sandboxes from, and whether each is ready (docs/api.md). */
import type { FastifyInstance } from 'fastify';
import type { SandboxManager } from '../../core/sandbox-manager.js';

export function registerTemplateRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.get('/v1/templates', async () => ({ templates: manager.listTemplates() }));

  app.get<{ Params: { name: string } }>('/v1/templates/:name', async (req) =>
    manager.describeTemplate(req.params.name),
  );

  // The whole story of a failed build (the template's `error` quotes only its last lines).
  app.get<{ Params: { name: string } }>('/v1/templates/:name/log', async (req, reply) =>
    reply.type('text/plain; charset=utf-8').send(await manager.templateBuildLog(req.params.name)),
  );
}
