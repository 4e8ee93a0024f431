/** Fork and merge on the wire (docs/api.md, Fork and merge). */
import Type, { type Static } from 'typebox';
import { MAX_FORK } from '../../core/lineage.js';
import { ref } from './schema.js';
import { Sandbox, SandboxId } from './sandbox.js';

export const ForkRequest = Type.Object(
  {
    n: Type.Integer({
      minimum: 1,
      maximum: MAX_FORK,
      description: 'Number of children; required, no default.',
    }),
  },
  { $id: 'ForkRequest', additionalProperties: false },
);
export type ForkRequest = Static<typeof ForkRequest>;

export const ForkResponse = Type.Object(
  {
    parent_id: ref(SandboxId),
    children: Type.Array(ref(Sandbox), {
      description: 'In no particular order; each child is ready.',
      minItems: 1,
      maxItems: MAX_FORK,
    }),
  },
  { $id: 'ForkResponse', additionalProperties: false },
);
export type ForkResponse = Static<typeof ForkResponse>;

export const MergeResponse = Type.Object(
  {
    id: ref(SandboxId, { description: "The parent id, now driving the winner's VM." }),
    state: Type.Literal('ready'),
    merged: ref(SandboxId, { description: 'The winner id, which is gone.' }),
  },
  { $id: 'MergeResponse', additionalProperties: false },
);
export type MergeResponse = Static<typeof MergeResponse>;
