/**
 * One error class per kind of failure, each with a stable `code` string. The code is what to
 * test in code that may see errors from another copy of this package (two versions in one
 * dependency tree, a bundled CLI): `instanceof` across copies is made to work too, by checking
 * a brand shared through the global symbol registry rather than the prototype chain.
 *
 * HTTP status to class (the server's `{"error": message}` becomes the message):
 *
 * | Status                       | Class               | code                   |
 * |------------------------------|---------------------|------------------------|
 * | 401, 403                     | AuthenticationError | `authentication_error` |
 * | 404, 410                     | NotFoundError       | `not_found`            |
 * | 400, 413, 415 and other 4xx  | InvalidRequestError | `invalid_request`      |
 * | 429                          | LimitReachedError   | `limit_reached`        |
 * | 500                          | ExecutorError       | `executor_error`       |
 * | 502, 503, 504                | UnavailableError    | `unavailable`          |
 * | other                        | HostdError          | `hostd_error`          |
 * | no HTTP response at all      | ConnectionError     | `connection_error`     |
 *
 * An exec stream that reports a failure in-stream (an `exit` event with an `error` field) or
 * that ends without an `exit` event raises ExecutorError with `status` undefined.
 */

import type { ExitEvent } from './types.js';

export type HostdErrorCode =
  | 'hostd_error'
  | 'authentication_error'
  | 'not_found'
  | 'invalid_request'
  | 'executor_error'
  | 'limit_reached'
  | 'unavailable'
  | 'connection_error';

/** Shared by every copy of the package through the global symbol registry. */
const BRAND = Symbol.for('@hostd/sdk.error');

/** The classes of this copy of the package; `instanceof` on anything else is the usual check. */
const ownClasses = new Set<unknown>();

export interface HostdErrorOptions {
  /** HTTP status of the response that carried the error, if there was one. */
  status?: number;
  cause?: unknown;
}

/**
 * Base class of every error the SDK throws (aborts excepted: an aborted signal rejects with the
 * signal's reason, as fetch does).
 *
 * @example
 * try { await Sandbox.connect('sbx_0123') } catch (e) { if (isHostdError(e, 'not_found')) ... }
 */
export class HostdError extends Error {
  /** The `code` of the errors this class stands for; undefined for the base class. */
  static readonly errorCode: HostdErrorCode | undefined = undefined;

  /** Stable machine-readable kind; see the table at the top of this module. */
  readonly code: HostdErrorCode;
  /** HTTP status, or undefined when the failure was not an HTTP error response. */
  readonly status: number | undefined;

  constructor(message: string, options: HostdErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = (new.target as typeof HostdError).errorCode ?? 'hostd_error';
    this.status = options.status;
    Object.defineProperty(this, BRAND, { value: true });
  }

  static override [Symbol.hasInstance](value: unknown): boolean {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true;
    if (!ownClasses.has(this)) return false;
    return isHostdError(value, (this as typeof HostdError).errorCode);
  }
}

/** 401: the API key is missing or not one the server knows. */
export class AuthenticationError extends HostdError {
  static override readonly errorCode = 'authentication_error';
}

/** 404: no such sandbox (never existed, deleted, merged away), template or route. */
export class NotFoundError extends HostdError {
  static override readonly errorCode = 'not_found';
}

/** 400 (and 413, 415, other 4xx): the request was malformed or out of bounds. */
export class InvalidRequestError extends HostdError {
  static override readonly errorCode = 'invalid_request';
}

/**
 * 500, or an exec stream that failed after it started: the VM failed to start or died, or its
 * agent stopped answering. For an in-stream failure, `event` is the `exit` event that carried it.
 */
export class ExecutorError extends HostdError {
  static override readonly errorCode = 'executor_error';
  /** The in-stream `exit` event with its `error` field, when the failure came that way. */
  readonly event: ExitEvent | undefined;

  constructor(message: string, options: HostdErrorOptions & { event?: ExitEvent } = {}) {
    super(message, options);
    this.event = options.event;
  }
}

/** 429: a configured cap is reached (sandboxes alive, requests queued on one sandbox). Retryable. */
export class LimitReachedError extends HostdError {
  static override readonly errorCode = 'limit_reached';
}

/** 503 (and 502, 504): hostd is shutting down or lacks memory or disk. Retryable. */
export class UnavailableError extends HostdError {
  static override readonly errorCode = 'unavailable';
}

/** No HTTP response: connection refused, DNS failure, connection reset before the headers. */
export class ConnectionError extends HostdError {
  static override readonly errorCode = 'connection_error';
}

for (const cls of [
  HostdError,
  AuthenticationError,
  NotFoundError,
  InvalidRequestError,
  ExecutorError,
  LimitReachedError,
  UnavailableError,
  ConnectionError,
]) {
  ownClasses.add(cls);
}

/**
 * True when `value` is an error thrown by any copy of this SDK, and, when `code` is given, of
 * that kind. Prefer this to `instanceof` in code that may see several copies of the package.
 *
 * @example
 * if (isHostdError(err, 'not_found')) console.log('gone already');
 */
export function isHostdError(value: unknown, code?: HostdErrorCode): value is HostdError {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as { code?: unknown };
  if ((value as Record<symbol, unknown>)[BRAND] !== true || typeof v.code !== 'string')
    return false;
  return code === undefined || v.code === code;
}

/** Human label of a code, as the CLI prints it: `sbx: not found: sandbox sbx_… not found`. */
export function describeCode(code: HostdErrorCode): string {
  switch (code) {
    case 'authentication_error':
      return 'authentication failed';
    case 'not_found':
      return 'not found';
    case 'invalid_request':
      return 'invalid request';
    case 'executor_error':
      return 'executor error';
    case 'limit_reached':
      return 'limit reached';
    case 'unavailable':
      return 'unavailable';
    case 'connection_error':
      return 'cannot connect';
    case 'hostd_error':
      return 'error';
  }
}

/** The error for a non-2xx response; `message` is the server's `error` field when it sent one. */
export function errorForStatus(status: number, message: string): HostdError {
  const options = { status };
  if (status === 401 || status === 403) return new AuthenticationError(message, options);
  if (status === 404 || status === 410) return new NotFoundError(message, options);
  if (status === 429) return new LimitReachedError(message, options);
  if (status >= 400 && status < 500) return new InvalidRequestError(message, options);
  if (status === 500) return new ExecutorError(message, options);
  if (status === 502 || status === 503 || status === 504) {
    return new UnavailableError(message, options);
  }
  return new HostdError(message, options);
}
