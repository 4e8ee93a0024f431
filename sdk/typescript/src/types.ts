/**
 * Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers. Objects the
 * server describes (sandboxes, snapshots, templates, file entries) keep the API's snake_case
 * field names, so that docs/api.md, both SDKs and `sbx ... --json` show the same names: they are
 * aliases of ./wire.gen.ts, generated from docs/openapi.json (`npm run gen:sdk-types`). What the
 * SDK makes itself (events, results, displays) is written here.
 */
import type { components } from './wire.gen.js';

type Schemas = components['schemas'];

/** One line of output of an exec: `data` is the line without its newline. */
export interface OutputEvent<T extends 'stdout' | 'stderr' = 'stdout' | 'stderr'> {
  type: T;
  data: string;
  /** Position in this exec's stream, from 0. */
  seq: number;
  /** Host wall-clock time, milliseconds since the epoch. */
  ts: number;
  /** Notebook cells: `data` does not end its line (a last line without its newline). */
  partial?: true;
}

/**
 * A MIME bundle as in Jupyter's display protocol: `image/png` and `image/jpeg` are base64,
 * `text/*` and `image/svg+xml` strings, `application/json` any JSON value. Every bundle has
 * `text/plain`.
 */
export type MimeBundle = Record<string, unknown>;

/** A rich output of a Python exec run with `display: true` (a figure, a DataFrame, ...). */
export interface DisplayEvent {
  type: 'display';
  data: MimeBundle;
  seq: number;
  ts: number;
}

/** Notebook cells, first: how many notebook cells the exec's context has run, this one included. */
export interface ExecutionCountEvent {
  type: 'execution_count';
  data: number;
  seq: number;
  ts: number;
}

/** Notebook cells: the value of the cell's last expression, as a MIME bundle. */
export interface ResultEvent {
  type: 'result';
  data: MimeBundle;
  seq: number;
  ts: number;
}

/**
 * A notebook cell's uncaught exception: `name` is the exception's class name (`NameError`),
 * `value` its message, `traceback` the traceback as Python prints it.
 */
export type CellError = Schemas['CellError'];

/** Notebook cells: the cell's uncaught exception (nothing goes to stderr for it). */
export interface ErrorEvent {
  type: 'error';
  data: CellError;
  seq: number;
  ts: number;
}

/**
 * The last event of an exec: `data` is the program's exit code. hostd reports a failure after
 * the stream started as an exit event with `data: -1` and an `error` field; the SDK raises
 * ExecutorError for it instead of yielding it.
 */
export interface ExitEvent {
  type: 'exit';
  data: number;
  seq: number;
  ts: number;
  error?: string;
}

/** One member per type, so that checking `type` narrows an event to its shape. */
export type ExecEvent =
  | OutputEvent<'stdout'>
  | OutputEvent<'stderr'>
  | DisplayEvent
  | ExecutionCountEvent
  | ResultEvent
  | ErrorEvent
  | ExitEvent;

export type Language = 'python' | 'bash';

/**
 * A display decoded for use: the common MIME types as fields (`png` and `jpeg` as bytes), and
 * the whole bundle in `data` for the others.
 */
export interface Display {
  /** The raw MIME bundle, as hostd sent it. */
  data: MimeBundle;
  /** `text/plain`: every display has one. */
  text?: string;
  /** `text/html` (a DataFrame, an object with `_repr_html_`). */
  html?: string;
  /** `text/markdown`. */
  markdown?: string;
  /** `text/latex`. */
  latex?: string;
  /** `image/svg+xml`. */
  svg?: string;
  /** `image/png`, decoded from base64. */
  png?: Buffer;
  /** `image/jpeg`, decoded from base64. */
  jpeg?: Buffer;
  /** `application/json`. */
  json?: unknown;
  /**
   * Notebook cells: a DataFrame's columns, `{column: [value, ...]}`
   * (`application/vnd.hostd.dataframe+json`).
   */
  dataframe?: Record<string, unknown[]>;
  /**
   * Notebook cells: what a matplotlib figure plots (`application/vnd.hostd.chart+json`, see
   * docs/api.md, Notebook mode): `type`, `title`, `elements`, and for 2D charts labels and ticks.
   */
  chart?: Record<string, unknown>;
}

/** What `Sandbox.run` resolves to. */
export interface RunResult {
  /** Every stdout line, each followed by a newline. */
  stdout: string;
  /** Every stderr line, each followed by a newline. */
  stderr: string;
  exitCode: number;
  /** Rich outputs in the order they came; empty unless the run asked for `display: true`. */
  displays: Display[];
  /** Notebook cells: the value of the last expression (absent when it had none). */
  result?: Display;
  /** Notebook cells: the uncaught exception (absent when there was none). */
  error?: CellError;
  /** Notebook cells: the cell's execution count in its context. */
  executionCount?: number;
}

/**
 * A REPL context (docs/api.md, Contexts): an independent namespace in the sandbox's REPL. `id` is
 * `default` for the REPL's own namespace; `execution_count` counts the notebook cells it has run.
 */
export type ContextInfo = Schemas['Context'];

/**
 * `ready` (running), `paused` (on disk, resumed by its next use) or `failed` (see
 * SandboxInfo's `error`).
 */
export type SandboxState = Schemas['SandboxInfo']['state'];

/** A sandbox's egress rules and traffic counts. */
export type NetworkInfo = NonNullable<Schemas['SandboxInfo']['network']>;

/**
 * A sandbox as `GET /v1/sandboxes/{id}` describes it. Times are ISO 8601. `memory_mib` is host
 * memory that is the sandbox's own (null while paused or failed); `merged_from` lists the
 * sandboxes merged into it, oldest first. The fields after `queued` are optional in the SDK's
 * type so that objects built by hand and an older hostd's answers still fit.
 */
export type SandboxInfo = Schemas['SandboxInfo'];

/** One merge into a sandbox: the winner's id (gone since) and when it was merged (ISO 8601). */
export type MergeInfo = NonNullable<Schemas['SandboxInfo']['merged_from']>[number];

/**
 * A file, directory or link inside a sandbox, as `files.list` and `files.stat` describe it.
 * `path` is absolute in the sandbox; `mode` the permission bits as a number (`420` is `0o644`);
 * a symlink's `target` is null when the guest could not read the link.
 */
export type EntryInfo = Schemas['FileEntry'];

/** What `files.write` wrote. */
export type WriteInfo = Schemas['FileWritten'];

/**
 * What `files.uploadDir` and `files.downloadDir` moved: the destination directory, regular files
 * and their bytes.
 */
export type TransferInfo = Required<Schemas['FileWritten']>;

/**
 * A snapshot as hostd describes it: `sandboxes` counts the running or paused sandboxes that still
 * use its files; `name` is the name it was given, or null.
 */
export type SnapshotInfo = Schemas['Snapshot'];

/**
 * A template (guest environment) as hostd describes it. `state` `building`: creates get
 * TemplateUnavailableError; `failed`: TemplateFailedError (`error` says why). `image_key` and
 * `built_at` are null while it builds or after a failed build.
 */
export type TemplateInfo = Schemas['Template'];
