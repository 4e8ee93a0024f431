/** Data shapes of the hostd HTTP API (docs/api.md), as the SDK hands them to callers. */

/** One line of output of an exec: `data` is the line without its newline. */
export interface OutputEvent {
  type: 'stdout' | 'stderr';
  data: string;
  /** Position in this exec's stream, from 0. */
  seq: number;
  /** Host wall-clock time, milliseconds since the epoch. */
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

export type ExecEvent = OutputEvent | ExitEvent;

export type Language = 'python' | 'bash';

/** A sandbox as `GET /v1/sandboxes/{id}` describes it. */
export interface SandboxInfo {
  id: string;
  state: string;
  template: string;
  /** ISO 8601. */
  created_at: string;
  /** ISO 8601. */
  last_used_at: string;
  /** The sandbox this one was forked from (which may have been deleted since), or null. */
  parent_id: string | null;
  /** True while an exec, fork or merge holds the sandbox. */
  busy: boolean;
  /** Requests waiting behind the one that holds it. */
  queued: number;
}

/** What `Sandbox.run` resolves to. */
export interface RunResult {
  /** Every stdout line, each followed by a newline. */
  stdout: string;
  /** Every stderr line, each followed by a newline. */
  stderr: string;
  exitCode: number;
}
