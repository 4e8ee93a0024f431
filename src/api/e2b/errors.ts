/**
 * Registry errors (src/errors.ts) rendered in the shapes E2B's SDKs read (docs/e2b.md, Errors):
 * the control plane and envd's REST routes answer `{"code": <HTTP status>, "message"}`, with
 * hostd's stable code as `error_code`; Connect RPCs answer `{"code": "<connect code>",
 * "message"}`. Several SDK branches read `code` from the body rather than the status (kill
 * returns false on a body code 404, pause on 409), so the body's code is always the status sent.
 */
import type { FastifyReply } from 'fastify';
import { fail, HostdError, isError, toHostdError } from '../../errors.js';

/**
 * The HTTP status an E2B client gets for a registry error. A sandbox lost while hostd was down
 * is gone for an E2B client (the SDKs know "not found", not "lost"): 404.
 */
export function e2bStatus(err: HostdError): number {
  if (err.code === 'sandbox_lost') return 404;
  return err.status;
}

/** E2B's REST error body: the control plane's `Error` schema, and envd's. */
export interface E2bErrorBody {
  code: number;
  message: string;
  /** hostd's stable code (docs/api.md, Errors), for clients that want more than the status. */
  error_code: string;
  /** Only on 502 for a sandbox that is not running, as E2B's proxy answers. */
  sandboxId?: string;
}

export function e2bErrorBody(err: HostdError): E2bErrorBody {
  const body: E2bErrorBody = { code: e2bStatus(err), message: err.message, error_code: err.code };
  if (isError(err, 'sandboxNotRunning')) body.sandboxId = String(err.params[0]);
  return body;
}

/** Sends `err` as E2B's REST error (control plane, envd `/files`, `/health`). */
export function sendE2bError(reply: FastifyReply, err: unknown): FastifyReply {
  const e = toHostdError(err, reply.request.id);
  if (e.retryAfterS !== undefined) void reply.header('retry-after', String(e.retryAfterS));
  return reply.code(e2bStatus(e)).type('application/json').send(e2bErrorBody(e));
}

/** Connect's error codes (connectrpc.com/docs/protocol, Error Codes) and their HTTP statuses. */
export const CONNECT_STATUS = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  out_of_range: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  data_loss: 500,
  unauthenticated: 401,
} as const;
export type ConnectCode = keyof typeof CONNECT_STATUS;

/**
 * The Connect code of a registry error. The SDKs branch on these: `not_found` (kill returns
 * false, exists returns false), `already_exists` (makeDir returns false), `unavailable` (the
 * sandbox is gone), `invalid_argument`, `unauthenticated`.
 */
export function connectCode(err: HostdError): ConnectCode {
  switch (err.code) {
    case 'route_not_found':
    case 'not_supported':
      return 'unimplemented';
    case 'sandbox_not_running':
    case 'sandbox_lost':
    case 'shutting_down':
      return 'unavailable';
    case 'client_closed_request':
      return 'canceled';
    // envd's own codes for these (docs/e2b.md): an unknown user is an authentication failure,
    // a closed stdin a failed write, a stream cut by a pause or merge a sandbox gone away
    case 'unknown_user':
      return 'unauthenticated';
    case 'stdin_closed':
      return 'internal';
    case 'stream_interrupted':
      return 'unavailable';
    case 'processes_unavailable':
      return 'failed_precondition';
    case 'limit_reached':
    case 'body_too_large':
    case 'file_too_large':
    case 'sandbox_disk_full':
    case 'storage_limit_reached':
      return 'resource_exhausted';
    case 'insufficient_resources':
    case 'template_unavailable':
      return 'unavailable';
  }
  switch (err.status) {
    case 400:
    case 415:
      return 'invalid_argument';
    case 401:
      return 'unauthenticated';
    case 403:
      return 'permission_denied';
    case 404:
    case 410:
      return 'not_found';
    case 409:
      return 'already_exists';
    case 429:
      return 'resource_exhausted';
    case 501:
      return 'unimplemented';
    case 502:
    case 503:
      return 'unavailable';
    case 504:
      return 'deadline_exceeded';
    default:
      return 'internal';
  }
}

/** A Connect error's JSON: the body of a unary error, and the `error` of an end-stream message. */
export function connectErrorJson(
  err: unknown,
  requestId: string,
): { code: ConnectCode; message: string } {
  const e = toHostdError(err, requestId);
  return { code: connectCode(e), message: e.message };
}

/**
 * Sends `err` as a unary Connect error: the code's status, `application/json` (without it the
 * client ignores the body and guesses the code from the status alone). A sandbox that is not
 * running keeps E2B's 502, which the client reads as `unavailable` either way.
 */
export function sendConnectError(reply: FastifyReply, err: unknown): FastifyReply {
  const e = toHostdError(err, reply.request.id);
  const body = connectErrorJson(e, reply.request.id);
  const status = isError(e, 'sandboxNotRunning') ? 502 : CONNECT_STATUS[body.code];
  return reply.code(status).type('application/json').send(body);
}

/** True for a Connect RPC path (`/<package>.<Service>/<Method>`), whose errors are Connect's. */
export function isConnectPath(url: string): boolean {
  return /^\/[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+\/[A-Za-z_]\w*(\?|$)/.test(url);
}

/** Fastify's own failures (bad JSON, too large, no parser) as registry errors. */
export function classifyFrameworkError(
  err: { statusCode?: number; code?: string; message: string },
  maxBody: number,
  requestId: string,
): HostdError {
  if (err instanceof HostdError) return err;
  if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return fail('bodyTooLarge', null, maxBody);
  if (err.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
    return fail('unsupportedMediaType', 'application/json');
  }
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500) {
    return fail('malformedRequest', err.message);
  }
  return toHostdError(err, requestId);
}
