/**
 * @hostd/sdk: create sandboxes on a hostd server, run code in them with streamed output, fork
 * and merge their state, move files in and out, snapshot and pause them.
 *
 * @example
 * import { Sandbox } from '@hostd/sdk';
 * await using sandbox = await Sandbox.create(); // deleted when the scope ends
 * await sandbox.run('x = 42');
 * console.log((await sandbox.run('print(x)')).stdout); // "42\n"
 */
export { Sandbox } from './sandbox.js';
export type {
  CreateContextOptions,
  CreateOptions,
  ExecOptions,
  NetworkOptions,
  RunOptions,
  SetTimeoutOptions,
  SnapshotOptions,
} from './sandbox.js';
export { Files } from './files.js';
export type { RemoveOptions, WriteData, WriteOptions } from './files.js';
export { Snapshot } from './snapshot.js';
export { Template } from './template.js';
export {
  DEFAULT_BASE_URL,
  DEFAULT_MAX_RETRIES,
  DEFAULT_REQUEST_TIMEOUT_MS,
  resolveConfig,
} from './config.js';
export type { CallOptions, ClientConfig, ConnectionOptions } from './config.js';
export {
  AuthenticationError,
  ConnectionError,
  ContextExistsError,
  ContextNotFoundError,
  ExecutorError,
  HostdError,
  InsufficientResourcesError,
  InsufficientStorageError,
  InvalidRequestError,
  LimitReachedError,
  NotFoundError,
  RateLimitError,
  RequestTimeoutError,
  RouteNotFoundError,
  SandboxDiskFullError,
  SandboxFileNotFoundError,
  SandboxLostError,
  SandboxNotFoundError,
  ShuttingDownError,
  SnapshotNotFoundError,
  StorageLimitError,
  TemplateFailedError,
  TemplateNotFoundError,
  TemplateUnavailableError,
  UnavailableError,
  describeCode,
  describeError,
  errorForStatus,
  errorFromResponse,
  isHostdError,
} from './errors.js';
export type { ErrorResponse, HostdErrorCode, HostdErrorOptions, KnownErrorCode } from './errors.js';
export { UnsafeArchiveError } from './tar-extract.js';
export { toDisplay } from './display.js';
export type {
  CellError,
  ContextInfo,
  Display,
  DisplayEvent,
  EntryInfo,
  ErrorEvent,
  ExecEvent,
  ExecutionCountEvent,
  ExitEvent,
  Language,
  MergeInfo,
  MimeBundle,
  NetworkInfo,
  OutputEvent,
  ResultEvent,
  RunResult,
  SandboxInfo,
  SandboxState,
  SnapshotInfo,
  TemplateInfo,
  TransferInfo,
  WriteInfo,
} from './types.js';
export { traceparent } from './trace.js';
