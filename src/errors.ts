/**
 * The one error registry of hostd. Every failure that can reach a client is a `HostdError`
 * built from an entry here, so its stable `code`, HTTP `status` and message shape are decided
 * in one place and documented in docs/api.md (a test checks the two agree).
 *
 * Layers throw these; only the api layer turns them into HTTP responses. Messages never carry
 * secrets (API keys) or host paths.
 */

/** A registry entry: the stable machine-readable code and the HTTP status it maps to. */
export interface ErrorKind {
  readonly code: string;
  readonly status: number;
}

export const ErrorKinds = {
  /** Malformed JSON, wrong field types, out-of-range values. */
  invalidRequest: { code: 'invalid_request', status: 400 },
  /** Merging a sandbox into itself. */
  mergeIntoSelf: { code: 'merge_into_self', status: 400 },
  /** No Authorization header on a guarded route. */
  missingApiKey: { code: 'missing_api_key', status: 401 },
  /** Authorization header present but the key is not configured. */
  invalidApiKey: { code: 'invalid_api_key', status: 401 },
  /** The sandbox id is unknown: never existed, deleted, merged away, or malformed. */
  sandboxNotFound: { code: 'sandbox_not_found', status: 404 },
  /** The requested template does not exist. */
  templateNotFound: { code: 'template_not_found', status: 404 },
  /** No route matches the method and path. */
  routeNotFound: { code: 'route_not_found', status: 404 },
  /** The request body is larger than the configured limit. */
  bodyTooLarge: { code: 'body_too_large', status: 413 },
  /** The request's Content-Type is not application/json. */
  unsupportedMediaType: { code: 'unsupported_media_type', status: 415 },
  /** A configured cap (sandboxes alive, queued execs) is reached; retrying later can work. */
  limitReached: { code: 'limit_reached', status: 429 },
  /** The VM failed to start, died, or its agent stopped answering. */
  executorError: { code: 'executor_error', status: 500 },
  /** The host lacks memory or disk to start another VM. */
  insufficientResources: { code: 'insufficient_resources', status: 503 },
  /** hostd is shutting down and takes no new work. */
  shuttingDown: { code: 'shutting_down', status: 503 },
  /** A bug: anything not classified above. */
  internal: { code: 'internal_error', status: 500 },
} as const satisfies Record<string, ErrorKind>;

export type ErrorKindName = keyof typeof ErrorKinds;

/**
 * A failure with a registry kind. Throw it from any layer; the api layer renders it as
 * `{"error": message}` with `kind.status`.
 */
export class HostdError extends Error {
  readonly kind: ErrorKind;

  constructor(kind: ErrorKind, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'HostdError';
    this.kind = kind;
  }

  get code(): string {
    return this.kind.code;
  }

  get status(): number {
    return this.kind.status;
  }
}

/** Shorthand used across layers: `fail('sandboxNotFound', 'sandbox sbx_... not found')`. */
export function fail(kind: ErrorKindName, message: string, cause?: unknown): HostdError {
  return new HostdError(ErrorKinds[kind], message, cause === undefined ? undefined : { cause });
}

/** Wraps anything thrown into a HostdError, keeping HostdErrors as they are. */
export function toHostdError(err: unknown): HostdError {
  if (err instanceof HostdError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new HostdError(ErrorKinds.internal, `internal error: ${message}`, { cause: err });
}
