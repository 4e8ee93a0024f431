/**
 * Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers. Objects the
 * server describes (sandboxes, snapshots, templates, file entries) keep the API's snake_case
 * field names, so that docs/api.md, both SDKs and `sbx ... --json` show the same names.
 */

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

/** A notebook cell's uncaught exception. */
export interface CellError {
  /** The exception's class name, e.g. `NameError`. */
  name: string;
  /** Its message. */
  value: string;
  /** The traceback as Python prints it. */
  traceback: string;
}

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

/** A REPL context (docs/api.md, Contexts): an independent namespace in the sandbox's REPL. */
export interface ContextInfo {
  /** `default` for the REPL's own namespace. */
  id: string;
  /** Its working directory. */
  cwd: string;
  /** Notebook cells it has run. */
  execution_count: number;
}

export type SandboxState = 'ready' | 'paused' | 'failed';

/** A sandbox's egress rules and traffic counts. */
export interface NetworkInfo {
  allow_out: string[];
  bytes_out: number;
  bytes_in: number;
}

/** A sandbox as `GET /v1/sandboxes/{id}` describes it. */
export interface SandboxInfo {
  id: string;
  /** `ready` (running), `paused` (on disk, resumed by its next use) or `failed` (see `error`). */
  state: SandboxState;
  template: string;
  /** ISO 8601. */
  created_at: string;
  /** ISO 8601. */
  last_used_at: string;
  /** The sandbox this one was forked from (which may have been deleted since), or null. */
  parent_id: string | null;
  /** The snapshot this sandbox was created from, or null. */
  snapshot_id?: string | null;
  /** True while an exec, fork, merge, snapshot or pause holds the sandbox. */
  busy: boolean;
  /** Requests waiting behind the one that holds it. */
  queued: number;
  /** Why a `failed` sandbox's VM died; null otherwise. */
  error?: string | null;
  network?: NetworkInfo;
  /**
   * Host memory (MiB) that is this sandbox's own (pages it wrote, its VM's buffers), not shared
   * with its template or fork point; null while paused or failed. Absent from older servers.
   */
  memory_mib?: number | null;
  /** Sandboxes merged into this one (their ids are gone since), oldest first. */
  merged_from?: MergeInfo[];
  /** The labels given at create (`{}` without). */
  metadata?: Record<string, string>;
  /** Its lifetime in seconds of running time, or null (none). */
  timeout?: number | null;
  /** What happens when its lifetime is up, or null (no lifetime). */
  on_timeout?: 'delete' | 'pause' | null;
  /** When a running sandbox's lifetime ends (ISO 8601); null while paused or without one. */
  expires_at?: string | null;
  /** Why a paused sandbox is paused (`request`, `lifetime`, `idle`, `shutdown`); null running. */
  paused_by?: 'request' | 'lifetime' | 'idle' | 'shutdown' | null;
}

/** One merge into a sandbox: the winner's id and when it was merged. */
export interface MergeInfo {
  id: string;
  /** ISO 8601. */
  merged_at: string;
}

/** A file, directory or link inside a sandbox, as `files.list` and `files.stat` describe it. */
export interface EntryInfo {
  name: string;
  /** Absolute path in the sandbox. */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  /** Permission bits as a number: `420` is `0o644`. */
  mode: number;
  mtime_ms: number;
  /** Where a symlink points; null when the guest could not read the link. */
  target?: string | null;
}

/** What `files.write` wrote. */
export interface WriteInfo {
  path: string;
  size: number;
}

/** What `files.uploadDir` and `files.downloadDir` moved: regular files and their bytes. */
export interface TransferInfo {
  /** The destination directory. */
  path: string;
  files: number;
  size: number;
}

/** A snapshot as hostd describes it. */
export interface SnapshotInfo {
  snapshot_id: string;
  source_sandbox_id: string;
  template: string;
  size_bytes: number;
  /** ISO 8601. */
  created_at: string;
  /** Running or paused sandboxes that still use the snapshot's files. */
  sandboxes: number;
  /** The name it was given, or null. */
  name?: string | null;
}

/** A template (guest environment) as hostd describes it. */
export interface TemplateInfo {
  name: string;
  /** True for the template that creates use when they name none. */
  default: boolean;
  /** `building`: creates get TemplateUnavailableError; `failed`: TemplateFailedError (`error`). */
  state: 'building' | 'ready' | 'failed';
  error: string | null;
  memory_mib: number;
  vcpus: number;
  pool_size: number;
  disk_mib: number;
  description: string;
  /** Python modules already imported in every sandbox's REPL. */
  preload: string[];
  debian_packages: string[];
  python_packages: string[];
  /** The content key of its built image; null while it builds or after a failed build. */
  image_key: string | null;
  /** ISO 8601, or null while building. */
  built_at: string | null;
}
