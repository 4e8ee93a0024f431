/**
 * Error classes. hostd answers every error with `{"error": message, "code": code}`; the SDK
 * picks the class by `code` first and by HTTP status second (a server or a proxy that sends no
 * code), so that programs branch on classes or on `code`, never on messages.
 *
 * | `code` (docs/api.md)                          | Class                      | Extends                   |
 * |-----------------------------------------------|----------------------------|---------------------------|
 * | `missing_api_key`, `invalid_api_key`          | AuthenticationError        | HostdError                |
 * | `invalid_request`, `merge_into_self`, `invalid_path`, `is_a_directory`, `not_a_directory`, `invalid_archive`, `unsupported_file`, `permission_denied` (403), `request_timeout` (408), `body_too_large`, `file_too_large`, `unsupported_media_type`, `headers_too_large` (431) | InvalidRequestError | HostdError |
 * | `sandbox_not_found`                           | SandboxNotFoundError       | NotFoundError             |
 * | `sandbox_lost` (410)                          | SandboxLostError           | NotFoundError             |
 * | `template_not_found`                          | TemplateNotFoundError      | NotFoundError             |
 * | `snapshot_not_found`                          | SnapshotNotFoundError      | NotFoundError             |
 * | `file_not_found`                              | SandboxFileNotFoundError   | NotFoundError             |
 * | `route_not_found`                             | RouteNotFoundError         | NotFoundError             |
 * | `context_not_found`                           | ContextNotFoundError       | NotFoundError             |
 * | `context_exists` (409)                        | ContextExistsError         | InvalidRequestError       |
 * | `context_is_default`                          | InvalidRequestError        | HostdError                |
 * | `limit_reached` (429)                         | RateLimitError             | HostdError                |
 * | `executor_error`, `internal_error`            | ExecutorError              | HostdError                |
 * | `template_failed`                             | TemplateFailedError        | ExecutorError             |
 * | `insufficient_resources`                      | InsufficientResourcesError | UnavailableError          |
 * | `template_unavailable`                        | TemplateUnavailableError   | UnavailableError          |
 * | `shutting_down`                               | ShuttingDownError          | UnavailableError          |
 * | `sandbox_disk_full`                           | SandboxDiskFullError       | InsufficientStorageError  |
 * | `storage_limit_reached`                       | StorageLimitError          | InsufficientStorageError  |
 *
 * Cluster mode's codes (`node_not_found`, `not_clustered`, `sandboxes_on_different_nodes`,
 * `cluster_conflict`, `cluster_unavailable`, `node_unavailable`, `sandbox_moving`, `node_draining`,
 * `hand_over_failed`) have no class of their own: their status decides, and `code` tells them apart.
 *
 * Without a known code, the status decides: 401/403 AuthenticationError, 404 NotFoundError,
 * 410 SandboxLostError, 429 RateLimitError, other 4xx InvalidRequestError, 500 ExecutorError,
 * 502/503/504 UnavailableError, 507 InsufficientStorageError, anything else HostdError. No
 * response at all is ConnectionError, and no answer in time RequestTimeoutError.
 *
 * The classes of the first SDK version (NotFoundError, UnavailableError, LimitReachedError, ...)
 * are the parents (or an alias) of the new ones, so code written against them still works.
 */

import type { ExitEvent } from './types.js';

/** Codes hostd sends (docs/api.md, "Errors") and the SDK's own class codes. */
export type KnownErrorCode =
  | 'hostd_error'
  | 'authentication_error'
  | 'missing_api_key'
  | 'invalid_api_key'
  | 'invalid_request'
  | 'merge_into_self'
  | 'invalid_path'
  | 'is_a_directory'
  | 'not_a_directory'
  | 'invalid_archive'
  | 'unsupported_file'
  | 'permission_denied'
  | 'body_too_large'
  | 'file_too_large'
  | 'unsupported_media_type'
  | 'headers_too_large'
  | 'not_found'
  | 'sandbox_not_found'
  | 'sandbox_lost'
  | 'template_not_found'
  | 'snapshot_not_found'
  | 'file_not_found'
  | 'route_not_found'
  | 'context_not_found'
  | 'context_exists'
  | 'context_is_default'
  | 'limit_reached'
  | 'executor_error'
  | 'template_failed'
  | 'internal_error'
  | 'unavailable'
  | 'insufficient_resources'
  | 'template_unavailable'
  | 'shutting_down'
  | 'insufficient_storage'
  | 'sandbox_disk_full'
  | 'storage_limit_reached'
  | 'connection_error'
  | 'request_timeout';

/** A known code, or any other string a newer server may send. */
export type HostdErrorCode = KnownErrorCode | (string & {});

/** Shared by every copy of the package through the global symbol registry. */
const BRAND = Symbol.for('@hostd/sdk.error');

/** The classes of this copy of the package; `instanceof` on anything else is the usual check. */
const ownClasses = new Set<unknown>();

export interface HostdErrorOptions {
  /** HTTP status of the response that carried the error, if there was one. */
  status?: number;
  /** The server's `code`; default: the class's own code. */
  code?: string;
  /** From the response's `Retry-After`, in milliseconds. */
  retryAfterMs?: number;
  cause?: unknown;
}

/**
 * Base class of every error the SDK throws (aborts excepted: an aborted signal rejects with the
 * signal's reason).
 *
 * @example
 * try { await Sandbox.connect(id) } catch (e) { if (e instanceof SandboxNotFoundError) ... }
 */
export class HostdError extends Error {
  /** The code of this class: what `isHostdError(e, code)` matches for it and its subclasses. */
  static readonly errorCode: string = 'hostd_error';

  /** The server's machine-readable `code`, else this class's own; see the module table. */
  readonly code: HostdErrorCode;
  /** HTTP status, or undefined when the failure was not an HTTP error response. */
  readonly status: number | undefined;
  /**
   * How long the server asked to wait before retrying (`Retry-After`), when it said so. Set on
   * 429 and 503 answers after the SDK's own retries gave up.
   */
  readonly retryAfterMs: number | undefined;

  constructor(message: string, options: HostdErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof HostdError).errorCode;
    this.status = options.status;
    this.retryAfterMs = options.retryAfterMs;
    Object.defineProperty(this, BRAND, { value: true });
  }

  static override [Symbol.hasInstance](value: unknown): boolean {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true;
    if (!ownClasses.has(this)) return false;
    return isHostdError(value, (this as typeof HostdError).errorCode);
  }
}

/** 401: the API key is missing (`missing_api_key`) or unknown (`invalid_api_key`). */
export class AuthenticationError extends HostdError {
  static override readonly errorCode: string = 'authentication_error';
}

/** 400 (and 413, 415): the request was malformed or out of bounds; `code` says how. */
export class InvalidRequestError extends HostdError {
  static override readonly errorCode: string = 'invalid_request';
}

/** 404 or 410: the parent of every "no such thing" error. */
export class NotFoundError extends HostdError {
  static override readonly errorCode: string = 'not_found';
}

/** No such sandbox: never existed, deleted, merged away, or a malformed id. */
export class SandboxNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'sandbox_not_found';
}

/** 410: the sandbox's VM died while hostd was not running; delete it and make a new one. */
export class SandboxLostError extends NotFoundError {
  static override readonly errorCode: string = 'sandbox_lost';
}

/** Unknown template name; the message lists the known ones. */
export class TemplateNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'template_not_found';
}

/** Unknown or deleted snapshot. */
export class SnapshotNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'snapshot_not_found';
}

/** No file or directory at that path inside the sandbox (the sandbox itself exists). */
export class SandboxFileNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'file_not_found';
}

/** The server has no such route: it is older than this SDK (a feature it does not have yet). */
export class RouteNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'route_not_found';
}

/**
 * 429: a configured cap is reached (sandboxes alive, requests queued on one sandbox). The SDK
 * retries these itself (see `maxRetries`); this is thrown once it gives up.
 */
export class RateLimitError extends HostdError {
  static override readonly errorCode: string = 'limit_reached';
}

/** The first SDK version's name for RateLimitError. */
export const LimitReachedError = RateLimitError;
export type LimitReachedError = RateLimitError;

/**
 * 500, or an exec stream that failed after it started: the VM failed to start or died, or its
 * agent stopped answering. For an in-stream failure, `event` is the `exit` event that carried it.
 */
export class ExecutorError extends HostdError {
  static override readonly errorCode: string = 'executor_error';
  /** The in-stream `exit` event with its `error` field, when the failure came that way. */
  readonly event: ExitEvent | undefined;

  constructor(message: string, options: HostdErrorOptions & { event?: ExitEvent } = {}) {
    super(message, options);
    this.event = options.event;
  }
}

/** 500: the template's image failed to build; the message has the build's reason. */
export class TemplateFailedError extends ExecutorError {
  static override readonly errorCode: string = 'template_failed';
}

/** 503 (and 502, 504): the parent of the "not now" errors. The SDK retries 503s itself. */
export class UnavailableError extends HostdError {
  static override readonly errorCode: string = 'unavailable';
}

/** 503: the host lacks the memory or disk to start a VM now. */
export class InsufficientResourcesError extends UnavailableError {
  static override readonly errorCode: string = 'insufficient_resources';
}

/** 503: the template's image is still being built. */
export class TemplateUnavailableError extends UnavailableError {
  static override readonly errorCode: string = 'template_unavailable';
}

/** 503: hostd received SIGTERM and takes no new work. */
export class ShuttingDownError extends UnavailableError {
  static override readonly errorCode: string = 'shutting_down';
}

/** 507: a disk is full; nothing was left half-written. */
export class InsufficientStorageError extends HostdError {
  static override readonly errorCode: string = 'insufficient_storage';
}

/** 507: the sandbox's own disk is full. */
export class SandboxDiskFullError extends InsufficientStorageError {
  static override readonly errorCode: string = 'sandbox_disk_full';
}

/** 507: snapshots and paused sandboxes would exceed the server's SERVICE_MAX_STORAGE_MIB. */
export class StorageLimitError extends InsufficientStorageError {
  static override readonly errorCode: string = 'storage_limit_reached';
}

/** An exec or a request named a REPL context the sandbox does not have. */
export class ContextNotFoundError extends NotFoundError {
  static override readonly errorCode: string = 'context_not_found';
}

/** A context was created under an id the sandbox already has. */
export class ContextExistsError extends InvalidRequestError {
  static override readonly errorCode: string = 'context_exists';
}

/** No HTTP response: connection refused, DNS failure, connection reset before the headers. */
export class ConnectionError extends HostdError {
  static override readonly errorCode: string = 'connection_error';
}

/**
 * hostd sent nothing for longer than the request timeout (`requestTimeoutMs`), before its
 * answer or in the middle of a body. The request was abandoned (its connection closed).
 */
export class RequestTimeoutError extends ConnectionError {
  static override readonly errorCode: string = 'request_timeout';
}

const CLASSES = [
  HostdError,
  AuthenticationError,
  InvalidRequestError,
  NotFoundError,
  SandboxNotFoundError,
  SandboxLostError,
  TemplateNotFoundError,
  SnapshotNotFoundError,
  SandboxFileNotFoundError,
  RouteNotFoundError,
  ContextNotFoundError,
  ContextExistsError,
  RateLimitError,
  ExecutorError,
  TemplateFailedError,
  UnavailableError,
  InsufficientResourcesError,
  TemplateUnavailableError,
  ShuttingDownError,
  InsufficientStorageError,
  SandboxDiskFullError,
  StorageLimitError,
  ConnectionError,
  RequestTimeoutError,
];
for (const cls of CLASSES) ownClasses.add(cls);

type ErrorClass = new (message: string, options?: HostdErrorOptions) => HostdError;

/** The class of each code hostd sends; codes not listed fall back to the status. */
const CLASS_BY_CODE: Readonly<Record<string, ErrorClass>> = {
  missing_api_key: AuthenticationError,
  invalid_api_key: AuthenticationError,
  invalid_request: InvalidRequestError,
  merge_into_self: InvalidRequestError,
  invalid_path: InvalidRequestError,
  is_a_directory: InvalidRequestError,
  not_a_directory: InvalidRequestError,
  invalid_archive: InvalidRequestError,
  unsupported_file: InvalidRequestError,
  permission_denied: InvalidRequestError,
  body_too_large: InvalidRequestError,
  file_too_large: InvalidRequestError,
  unsupported_media_type: InvalidRequestError,
  headers_too_large: InvalidRequestError,
  // hostd's 408 (the request's headers came too slowly), not the SDK's own RequestTimeoutError.
  request_timeout: InvalidRequestError,
  sandbox_not_found: SandboxNotFoundError,
  sandbox_lost: SandboxLostError,
  template_not_found: TemplateNotFoundError,
  snapshot_not_found: SnapshotNotFoundError,
  file_not_found: SandboxFileNotFoundError,
  route_not_found: RouteNotFoundError,
  context_not_found: ContextNotFoundError,
  context_exists: ContextExistsError,
  context_is_default: InvalidRequestError,
  limit_reached: RateLimitError,
  executor_error: ExecutorError,
  internal_error: ExecutorError,
  template_failed: TemplateFailedError,
  insufficient_resources: InsufficientResourcesError,
  template_unavailable: TemplateUnavailableError,
  shutting_down: ShuttingDownError,
  sandbox_disk_full: SandboxDiskFullError,
  storage_limit_reached: StorageLimitError,
};

function classForStatus(status: number): ErrorClass {
  if (status === 401 || status === 403) return AuthenticationError;
  if (status === 404) return NotFoundError;
  if (status === 410) return SandboxLostError;
  if (status === 429) return RateLimitError;
  if (status >= 400 && status < 500) return InvalidRequestError;
  if (status === 500) return ExecutorError;
  if (status === 502 || status === 503 || status === 504) return UnavailableError;
  if (status === 507) return InsufficientStorageError;
  return HostdError;
}

/** What a non-2xx response said, as the SDK read it. */
export interface ErrorResponse {
  status: number;
  /** The body's `code`, when it had one. */
  code?: string | undefined;
  message: string;
  retryAfterMs?: number | undefined;
}

/**
 * The error for a non-2xx response: the class of its `code` when the SDK knows the code, else
 * the class of its status. The error keeps the server's code either way.
 */
export function errorFromResponse(r: ErrorResponse): HostdError {
  const byCode = r.code !== undefined && Object.hasOwn(CLASS_BY_CODE, r.code);
  const cls = byCode ? CLASS_BY_CODE[r.code!]! : classForStatus(r.status);
  const options: HostdErrorOptions = { status: r.status };
  if (r.code !== undefined) options.code = r.code;
  if (r.retryAfterMs !== undefined) options.retryAfterMs = r.retryAfterMs;
  return new cls(r.message, options);
}

/** The error for a status without a code (the first SDK version's entry point). */
export function errorForStatus(status: number, message: string): HostdError {
  return errorFromResponse({ status, message });
}

/** The class codes of `value`'s class and of its parents, nearest first. */
function classCodes(value: object): string[] {
  const codes: string[] = [];
  for (let p = Object.getPrototypeOf(value) as object | null; p; p = Object.getPrototypeOf(p)) {
    const ctor = (p as { constructor?: { errorCode?: unknown } }).constructor;
    if (ctor && Object.hasOwn(ctor, 'errorCode') && typeof ctor.errorCode === 'string') {
      codes.push(ctor.errorCode);
    }
  }
  return codes;
}

/**
 * True when `value` is an error thrown by any copy of this SDK and, when `code` is given, has
 * that code or is of a class with that code (`'not_found'` matches every NotFoundError). Prefer
 * this to `instanceof` in code that may see several copies of the package.
 *
 * @example
 * if (isHostdError(err, 'sandbox_not_found')) console.log('gone already');
 */
export function isHostdError(value: unknown, code?: HostdErrorCode): value is HostdError {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as { code?: unknown };
  if ((value as Record<symbol, unknown>)[BRAND] !== true || typeof v.code !== 'string')
    return false;
  return code === undefined || v.code === code || classCodes(value).includes(code);
}

const LABELS: Readonly<Record<string, string>> = {
  authentication_error: 'authentication failed',
  invalid_request: 'invalid request',
  not_found: 'not found',
  limit_reached: 'limit reached',
  executor_error: 'executor error',
  unavailable: 'unavailable',
  insufficient_storage: 'out of storage',
  request_timeout: 'timed out',
  connection_error: 'cannot connect',
  hostd_error: 'error',
};

/**
 * Human label of an error's kind, as the CLI prints it (`sbx: not found: sandbox sbx_… not
 * found`): the label of the nearest class that has one, so every NotFoundError reads "not found".
 */
export function describeError(err: HostdError): string {
  for (const code of classCodes(err)) {
    const label = LABELS[code];
    if (label !== undefined) return label;
  }
  return 'error';
}

/** Label of a class code (the first SDK version's entry point; see describeError). */
export function describeCode(code: HostdErrorCode): string {
  return LABELS[code] ?? 'error';
}
