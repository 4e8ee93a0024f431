/**
 * @hostd/sdk: create sandboxes on a hostd server, run code in them with streamed output, fork
 * and merge their state.
 *
 * @example
 * import { Sandbox } from '@hostd/sdk';
 * const sandbox = await Sandbox.create();
 * try {
 *   await sandbox.run('x = 42');
 *   console.log((await sandbox.run('print(x)')).stdout); // "42\n"
 * } finally {
 *   await sandbox.delete();
 * }
 */
export { Sandbox } from './sandbox.js';
export type { CallOptions, CreateOptions, ExecOptions, RunOptions } from './sandbox.js';
export { DEFAULT_BASE_URL, resolveConfig } from './config.js';
export type { ClientConfig, ConnectionOptions } from './config.js';
export {
  AuthenticationError,
  ConnectionError,
  ExecutorError,
  HostdError,
  InvalidRequestError,
  LimitReachedError,
  NotFoundError,
  UnavailableError,
  describeCode,
  errorForStatus,
  isHostdError,
} from './errors.js';
export type { HostdErrorCode, HostdErrorOptions } from './errors.js';
export type {
  ExecEvent,
  ExitEvent,
  Language,
  OutputEvent,
  RunResult,
  SandboxInfo,
} from './types.js';
export { traceparent } from './trace.js';
