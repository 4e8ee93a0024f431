/** REPL contexts on the wire (docs/api.md, Contexts). */
import Type, { type Static } from 'typebox';
import type { ContextInfo } from '../../core/sandbox-contexts.js';
import { CONTEXT_ID_PATTERN } from './exec.js';
import { ABSOLUTE_PATH, nullable, ref, sameAs } from './schema.js';

export const Context = Type.Object(
  {
    id: Type.String({ pattern: CONTEXT_ID_PATTERN, examples: ['default'] }),
    cwd: Type.String({ description: 'Its working directory.' }),
    execution_count: Type.Integer({ minimum: 0, description: 'Notebook cells it has run.' }),
  },
  {
    $id: 'Context',
    description:
      'A REPL context (docs/api.md, Contexts): an independent namespace with its own working directory and execution count.',
    additionalProperties: false,
  },
);
export type Context = Static<typeof Context>;
sameAs<Context, ContextInfo>(true);

export const ContextList = Type.Object(
  {
    contexts: Type.Array(ref(Context), { description: '`default` first, then in creation order.' }),
  },
  { $id: 'ContextList', additionalProperties: false },
);

export const ContextCreateRequest = Type.Object(
  {
    id: Type.Optional(
      nullable(
        Type.String({
          pattern: CONTEXT_ID_PATTERN,
          description: "The context's id; absent or null: 16 random hex digits.",
        }),
      ),
    ),
    cwd: Type.Optional(
      nullable(
        Type.String({
          pattern: ABSOLUTE_PATH,
          description: "An existing directory; absent or null: the default context's directory.",
        }),
      ),
    ),
  },
  { $id: 'ContextCreateRequest', additionalProperties: false },
);
export type ContextCreateRequest = Static<typeof ContextCreateRequest>;
