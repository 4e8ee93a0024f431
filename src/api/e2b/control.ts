/**
 * The E2B control plane (docs/e2b.md, Control plane): E2B's REST API for sandboxes, answered by
 * the same manager as the native API. Both endpoint generations are served: `POST
 * /v2/sandboxes` and `/v2/sandboxes/{id}/connect` (npm `e2b` 2.51) and `POST /sandboxes` and
 * `/sandboxes/{id}/connect` (older SDKs, the Python SDK).
 */
import type { FastifyInstance } from 'fastify';
import type { E2bContext } from './context.js';
import { fail } from '../../errors.js';

type IdParams = { id: string };

/** E2B's `Sandbox` answer (create, connect, fork entries). */
export interface E2bSandbox {
  sandboxID: string;
  templateID: string;
  clientID: string;
  envdVersion: string;
  envdAccessToken: string;
  trafficAccessToken: string;
  domain: null;
}

/**
 * E2B's template names, onto hostd's templates (docs/e2b.md, Templates): `base` (E2B's default:
 * Python, bash, git, curl) and `code-interpreter-v1` (@e2b/code-interpreter's default: the data
 * stack) are both `python`, the template with git, curl and pandas/matplotlib. When hostd does
 * not serve the target, the alias is the default template (the first of SERVICE_TEMPLATES).
 */
export const TEMPLATE_ALIASES: Readonly<Record<string, string>> = {
  base: 'python',
  'code-interpreter-v1': 'python',
};

/** The hostd template an E2B template name means. */
export function resolveTemplate(ctx: E2bContext, name: string): string {
  const served = ctx.manager.listTemplates().map((t) => t.name);
  if (served.includes(name)) return name;
  const target = TEMPLATE_ALIASES[name];
  if (target === undefined) return name; // unknown: the manager says template_not_found
  return served.includes(target) ? target : (served[0] ?? target);
}

/** What hostd says as E2B's deprecated `clientID`. */
const CLIENT_ID = 'hostd';

export function sandboxAnswer(ctx: E2bContext, id: string, template: string): E2bSandbox {
  return {
    sandboxID: id,
    templateID: template,
    clientID: CLIENT_ID,
    envdVersion: ctx.envdVersion,
    envdAccessToken: ctx.tokens.accessToken(id),
    trafficAccessToken: ctx.tokens.trafficToken(id),
    domain: null,
  };
}

export function registerControlRoutes(app: FastifyInstance, ctx: E2bContext): void {
  const { manager } = ctx;

  const create = async (body: unknown) => {
    const b = (body ?? {}) as { templateID?: unknown };
    if (typeof b.templateID !== 'string' || b.templateID === '') {
      throw fail('invalidField', 'templateID', 'a template name or id', b.templateID);
    }
    const sandbox = await manager.create({ template: resolveTemplate(ctx, b.templateID) });
    return sandboxAnswer(ctx, sandbox.id, sandbox.template);
  };
  app.post('/v2/sandboxes', async (req, reply) => reply.code(201).send(await create(req.body)));
  app.post('/sandboxes', async (req, reply) => reply.code(201).send(await create(req.body)));

  app.get<{ Params: IdParams }>('/sandboxes/:id', async (req) => {
    const info = manager.describe(req.params.id);
    return { sandboxID: info.id, templateID: info.template };
  });

  app.delete<{ Params: IdParams }>('/sandboxes/:id', async (req, reply) => {
    await manager.delete(req.params.id);
    return reply.code(204).send();
  });
}
