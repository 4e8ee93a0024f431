/** Exec on the wire (docs/api.md, Exec): the request and the NDJSON events it streams. */
import Type, { type Static, type TSchema } from 'typebox';
import { ABSOLUTE_PATH, nullable, pattern, ref } from './schema.js';
import { envSchema } from './sandbox.js';

/** Longest accepted exec timeout: a day. */
export const MAX_TIMEOUT_S = 86_400;

/** A REPL context id (docs/api.md, Contexts): what the guest accepts, and safe in a URL. */
export const CONTEXT_ID_PATTERN = pattern(
  '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$',
  "1 to 64 letters, digits, '_', '.' or '-', first a letter or digit",
);

export const ExecRequest = Type.Object(
  {
    code: Type.String({
      description: 'The code to run; at most the body limit (4 MiB by default).',
    }),
    language: Type.Optional(
      Type.Unsafe<'python' | 'bash' | null>({
        enum: ['python', 'bash', null],
        default: 'python',
        description: 'Absent or null means `python`.',
      }),
    ),
    timeout: Type.Optional(
      nullable(
        Type.Number({
          exclusiveMinimum: 0,
          maximum: MAX_TIMEOUT_S,
          description:
            'Seconds after which the code is interrupted (exit `124`). Absent or null means no timeout.',
        }),
      ),
    ),
    env: Type.Optional(
      envSchema("Extra environment variables for this exec, over the sandbox's `env`."),
    ),
    cwd: Type.Optional(
      nullable(
        Type.String({
          pattern: ABSOLUTE_PATH,
          description:
            'Absolute working directory for this exec (default `/root`); a missing one ends the exec with exit 1 and a stderr line.',
        }),
      ),
    ),
    display: Type.Optional(
      nullable(
        Type.Boolean({
          default: false,
          description: 'Python: emit rich outputs (figures, tables) as `display` events.',
        }),
      ),
    ),
    context: Type.Optional(
      nullable(
        Type.String({
          pattern: CONTEXT_ID_PATTERN,
          description:
            'Python only: the REPL context to run in (see `Context`); absent or null means the default context. One the sandbox does not have is `404 context_not_found`, answered before any stream.',
        }),
      ),
    ),
    notebook: Type.Optional(
      nullable(
        Type.Boolean({
          default: false,
          description:
            "Python only: run as a notebook cell (docs/api.md, Notebook mode): the first event is `execution_count`, the value of the last expression is a `result` event, an uncaught exception an `error` event, rich outputs are on, IPython's `!cmd` and `%magic` lines work and an indented cell is dedented.",
        }),
      ),
    ),
  },
  { $id: 'ExecRequest', additionalProperties: false },
);
export type ExecRequest = Static<typeof ExecRequest>;

export const CellError = Type.Object(
  {
    name: Type.String({ description: "The exception's class name, e.g. `NameError`." }),
    value: Type.String({ description: 'Its message (`str(exception)`).' }),
    traceback: Type.String({
      description: "The traceback as Python prints it, without hostd's own frames.",
    }),
  },
  {
    $id: 'CellError',
    description: "A notebook cell's uncaught exception.",
    additionalProperties: false,
  },
);

const seq = Type.Integer({ minimum: 0 });
const ts = Type.Integer();
/** A MIME bundle as in Jupyter's display protocol. */
const bundle = Type.Unsafe<Record<string, unknown>>({
  type: 'object',
  additionalProperties: true,
  required: ['text/plain'],
});

function event<P extends Record<string, TSchema>>(
  title: string,
  description: string,
  properties: P,
) {
  return Type.Object(properties, { title, description, additionalProperties: false });
}

/** The events of a stream, one schema each (their titles name them in docs/openapi.json). */
const events = Type.Union([
  event(
    'OutputEvent',
    'One line of output, without its newline, decoded as UTF-8 with replacement characters; at most 65536 bytes (longer lines are split). In a notebook cell, a piece that does not end its line has `partial: true`.',
    {
      type: Type.Enum(['stdout', 'stderr']),
      data: Type.String(),
      seq,
      ts,
      partial: Type.Optional(
        Type.Unsafe<true>({
          const: true,
          description:
            'Notebook cells only: the data does not end its line (a last line without its newline, a piece of a long line).',
        }),
      ),
    },
  ),
  event(
    'DisplayEvent',
    "A rich output of a Python exec that asked for them (`display: true` or `notebook: true`): a MIME bundle as in Jupyter's display protocol (binary types base64, every bundle has `text/plain`). In a notebook cell it also carries `application/vnd.hostd.dataframe+json` (a DataFrame's columns), `application/vnd.hostd.chart+json` (a figure's chart) or `application/json` (a list's or dict's value).",
    { type: Type.Unsafe<'display'>({ const: 'display' }), data: bundle, seq, ts },
  ),
  event(
    'ExecutionCountEvent',
    "Notebook cells only, first: how many notebook cells the exec's context has run, this one included.",
    {
      type: Type.Unsafe<'execution_count'>({ const: 'execution_count' }),
      data: Type.Integer({ minimum: 1 }),
      seq,
      ts,
    },
  ),
  event(
    'ResultEvent',
    "Notebook cells only: the value of the cell's last expression (not None, not ending with `;`), as a MIME bundle like a display event's.",
    { type: Type.Unsafe<'result'>({ const: 'result' }), data: bundle, seq, ts },
  ),
  event(
    'CellErrorEvent',
    "Notebook cells only: the cell's uncaught exception (also `SystemExit` with a code other than 0); nothing goes to stderr for it.",
    { type: Type.Unsafe<'error'>({ const: 'error' }), data: ref(CellError), seq, ts },
  ),
  event(
    'ExitEvent',
    'The last event: the exit code of the exec (`124` on timeout, 128+signal if the Python REPL was killed).',
    { type: Type.Unsafe<'exit'>({ const: 'exit' }), data: Type.Integer(), seq, ts },
  ),
  event(
    'ExecutorFailureEvent',
    'The last event when the exec could not finish after the stream started (VM died, agent not answering, sandbox deleted). Preceded by a `stderr` event `hostd: executor error: <reason>`. `data` is always -1 (never a real exit code).',
    {
      type: Type.Unsafe<'exit'>({ const: 'exit' }),
      data: Type.Unsafe<-1>({ const: -1 }),
      error: Type.String({ description: 'The reason.' }),
      seq,
      ts,
    },
  ),
]);

export const ExecEvent = Type.Unsafe<Static<typeof events>>({
  $id: 'ExecEvent',
  description:
    'One line of the exec NDJSON stream. `seq` starts at 0 and increases by one per event of the exec; `ts` is host wall-clock time in ms.',
  oneOf: events.anyOf,
  examples: [
    { type: 'stdout', data: 'hello', seq: 0, ts: 1763640000123 },
    { type: 'exit', data: 0, seq: 1, ts: 1763640000124 },
    { type: 'exit', data: -1, error: 'the VM exited (signal SIGKILL)', seq: 4, ts: 1763640000200 },
  ],
});
export type ExecEvent = Static<typeof ExecEvent>;
