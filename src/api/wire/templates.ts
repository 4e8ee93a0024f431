/** Templates on the wire (docs/api.md, Templates). */
import Type, { type Static } from 'typebox';
import type { TemplateInfo } from '../../core/sandbox-manager.js';
import { nullable, ref, stringEnum, sameAs } from './schema.js';

const names = (description: string) => Type.Array(Type.String(), { description });

export const Template = Type.Object(
  {
    name: Type.String({ description: 'What `POST /v1/sandboxes` takes as `template`.' }),
    default: Type.Boolean({
      description: 'True for the template a create without `template` gets (the first).',
    }),
    state: stringEnum(['building', 'ready', 'failed'], {
      description:
        '`building`: creates get `503 template_unavailable` with `Retry-After`; `failed`: creates get `500 template_failed` with `error`.',
    }),
    error: nullable(
      Type.String({
        description:
          'Why the template failed (a recipe error, or the failing build step and the end of its log); null otherwise.',
      }),
    ),
    memory_mib: Type.Integer({
      description: "Guest RAM of each VM: the recipe's unless configuration overrides it.",
    }),
    vcpus: Type.Integer(),
    pool_size: Type.Integer({ description: 'VMs kept restored and ready.' }),
    disk_mib: Type.Integer({ description: "Size of each VM's writable disk." }),
    description: Type.String(),
    preload: names("Modules already imported in every sandbox's REPL."),
    debian_packages: names(
      "Debian packages: once built, the recipe's and every template's base packages; before, the recipe's.",
    ),
    python_packages: names(
      "What pip installed (dependencies included) once built; before, the recipe's requirements.",
    ),
    image_key: nullable(Type.String({ description: 'Identifies the build; null until built.' })),
    built_at: nullable(
      Type.String({
        format: 'date-time',
        description: 'When the image was built; null until built.',
      }),
    ),
  },
  { $id: 'Template', additionalProperties: false },
);
export type Template = Static<typeof Template>;
sameAs<Template, TemplateInfo>(true);

export const TemplateList = Type.Object(
  { templates: Type.Array(ref(Template)) },
  { $id: 'TemplateList', additionalProperties: false },
);
