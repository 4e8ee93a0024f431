/**
 * Sandboxes on the wire (docs/api.md, Sandboxes): the create request, what a sandbox looks like
 * when listed and described, and its lifetime. Core's SandboxInfo is what the routes answer;
 * the check at the bottom keeps the two the same payload.
 */
import Type, { type Static } from 'typebox';
import { MAX_LIFETIME_S, type SandboxInfo as CoreSandboxInfo } from '../../core/sandbox-manager.js';
import {
  NO_NUL,
  nullable,
  nullableEnum,
  orNull,
  pattern,
  ref,
  stringEnum,
  stringMap,
  sameAs,
} from './schema.js';

export const SandboxId = Type.String({
  $id: 'SandboxId',
  pattern: '^sbx_[0-9a-f]{32}$',
  description: '`sbx_` + 32 lowercase hex characters from a CSPRNG.',
});

export const Sandbox = Type.Object(
  { id: ref(SandboxId), state: Type.Literal('ready') },
  {
    $id: 'Sandbox',
    description: 'A ready sandbox, as returned by create and in fork children.',
    additionalProperties: false,
  },
);
export type Sandbox = Static<typeof Sandbox>;

const dateTime = Type.String({ format: 'date-time' });

export const SandboxInfo = Type.Object(
  {
    id: ref(SandboxId),
    state: stringEnum(['ready', 'paused', 'failed'], {
      description:
        '`ready` runs; `paused` is written to disk (resumed by the next operation); `failed`: its VM died (`error` says why).',
    }),
    template: Type.String({ description: 'Template the sandbox (or its VM) came from.' }),
    created_at: dateTime,
    last_used_at: dateTime,
    parent_id: orNull(ref(SandboxId), {
      description:
        'The sandbox a fork child came from (it may have been deleted since); null otherwise.',
    }),
    busy: Type.Boolean({
      description: 'True while an exec, fork, merge, snapshot or pause holds the sandbox.',
    }),
    queued: Type.Integer({
      minimum: 0,
      description: 'Requests waiting behind the one holding the sandbox.',
    }),
    snapshot_id: orNull(Type.String(), {
      description: 'The snapshot the sandbox was created from, if any.',
    }),
    error: nullable(
      Type.String({ description: 'Why the sandbox failed, when `state` is `failed`.' }),
    ),
    network: Type.Object(
      {
        allow_out: Type.Array(Type.String()),
        bytes_out: Type.Integer({ minimum: 0 }),
        bytes_in: Type.Integer({ minimum: 0 }),
      },
      {
        description:
          "The sandbox's egress rules and the bytes its connections sent and received (docs/api.md, Network).",
        additionalProperties: false,
      },
    ),
    memory_mib: nullable(
      Type.Number({
        minimum: 0,
        description:
          "Host memory (MiB) that is this sandbox's own: its QEMU's anonymous resident memory (pages it wrote, the TCG translation buffer, QEMU's heap), not the pages it still shares with its template or fork point. `null` while paused or failed.",
      }),
    ),
    merged_from: Type.Array(
      Type.Object({ id: ref(SandboxId), merged_at: dateTime }, { additionalProperties: false }),
      {
        description:
          'The sandboxes merged into this one (their ids are gone since), oldest first; the 64 most recent.',
      },
    ),
    metadata: stringMap({ description: 'The labels given at create (`{}` without).' }),
    timeout: nullable(
      Type.Number({ description: 'Its lifetime in seconds of running time; null: none.' }),
    ),
    on_timeout: nullableEnum(['delete', 'pause'], {
      description: 'What happens when its lifetime is up; null without one.',
    }),
    expires_at: nullable(
      Type.String({
        format: 'date-time',
        description: "When a running sandbox's lifetime ends; null while paused or without one.",
      }),
    ),
    paused_by: nullableEnum(['request', 'lifetime', 'idle', 'shutdown'], {
      description:
        "Why a paused sandbox is paused (a pause call, its lifetime, the idle timeout, hostd's shutdown); null while it runs.",
    }),
    node: Type.Optional(
      Type.String({
        description:
          'Cluster mode only: the node that holds the sandbox (docs/cluster.md). Absent on a single hostd.',
      }),
    ),
  },
  {
    $id: 'SandboxInfo',
    description: 'A sandbox as listed and described.',
    additionalProperties: false,
  },
);
export type SandboxInfo = Static<typeof SandboxInfo>;
sameAs<SandboxInfo, CoreSandboxInfo>(true);

export const SandboxList = Type.Object(
  { sandboxes: Type.Array(ref(SandboxInfo)) },
  { $id: 'SandboxList', additionalProperties: false },
);

/** Names shells accept for environment variables (also the guest's rule). */
export const ENV_NAME_PATTERN = pattern(
  '^[A-Za-z_][A-Za-z0-9_]*$',
  'letters, digits and _ (not first a digit)',
);
/** Bounds of an environment; its byte total is checked by validate.ts (JSON Schema cannot). */
export const MAX_ENV_ENTRIES = 256;
export const MAX_ENV_BYTES = 64 * 1024;
/** Bounds of metadata; its byte total is checked by validate.ts. */
export const MAX_METADATA_ENTRIES = 64;
export const MAX_METADATA_BYTES = 16 * 1024;
/** Most egress rules a sandbox takes. */
export const MAX_ALLOW_OUT = 256;

/** An environment as create and exec take it. */
export function envSchema(description: string) {
  return nullable(
    stringMap({
      additionalProperties: { type: 'string', pattern: NO_NUL },
      maxProperties: MAX_ENV_ENTRIES,
      propertyNames: { pattern: ENV_NAME_PATTERN },
      description,
    }),
  );
}

export const CreateRequest = Type.Object(
  {
    template: Type.Optional(
      nullable(
        Type.String({
          minLength: 1,
          description:
            'Template name; absent or null means the default template (the first of `GET /v1/templates`: `python` unless `SERVICE_TEMPLATES` says otherwise).',
        }),
      ),
    ),
    snapshot: Type.Optional(
      nullable(
        Type.String({
          minLength: 1,
          description:
            'Create the sandbox from this snapshot (`snap_…`) instead of a template; not together with `template`.',
        }),
      ),
    ),
    env: Type.Optional(
      envSchema(
        "The sandbox's default environment: bash's environment and Python's `os.environ`; fork children inherit it.",
      ),
    ),
    network: Type.Optional(
      nullable(
        Type.Object(
          {
            allow_out: Type.Optional(
              Type.Array(Type.String(), {
                maxItems: MAX_ALLOW_OUT,
                description:
                  'Egress rules (docs/api.md, Network): `host`, `host:port`, `*.domain`, CIDR, IP, `*`, `host.hostd.internal:PORT`.',
              }),
            ),
          },
          {
            additionalProperties: false,
            description: 'Outbound network access; absent means none.',
          },
        ),
      ),
    ),
    metadata: Type.Optional(
      nullable(
        stringMap({
          maxProperties: MAX_METADATA_ENTRIES,
          description:
            'Labels of yours (at most 64, 16 KiB in all), shown in the sandbox and kept with it; fork children inherit them.',
        }),
      ),
    ),
    timeout: Type.Optional(
      nullable(
        Type.Number({
          exclusiveMinimum: 0,
          maximum: MAX_LIFETIME_S,
          description:
            'A lifetime: seconds of running time, after which the sandbox is deleted (or paused, `on_timeout`). Pausing stops the clock; each resume gives the whole lifetime again (docs/api.md, Metadata and lifetime).',
        }),
      ),
    ),
    on_timeout: Type.Optional(
      nullableEnum(['delete', 'pause'], {
        description:
          'What happens when the lifetime is up (default `delete`); only with `timeout`.',
      }),
    ),
  },
  { $id: 'CreateRequest', additionalProperties: false },
);
export type CreateRequest = Static<typeof CreateRequest>;

export const TimeoutRequest = Type.Object(
  {
    timeout: nullable(
      Type.Number({
        exclusiveMinimum: 0,
        maximum: MAX_LIFETIME_S,
        description: 'Seconds from now; null removes the lifetime.',
      }),
    ),
    on_timeout: Type.Optional(
      nullableEnum(['delete', 'pause'], {
        description:
          'What happens when the lifetime is up; absent or null keeps the current choice.',
      }),
    ),
  },
  {
    $id: 'TimeoutRequest',
    description: "`POST /v1/sandboxes/{id}/timeout`: a running sandbox's new lifetime.",
    additionalProperties: false,
  },
);
export type TimeoutRequest = Static<typeof TimeoutRequest>;

export const SandboxState = Type.Object(
  { id: ref(SandboxId), state: stringEnum(['ready', 'paused']) },
  { $id: 'SandboxState', additionalProperties: false },
);
