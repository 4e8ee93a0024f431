/**
 * The one error registry of hostd. Every failure that can reach a client is a `HostdError`
 * made from an entry here (`fail('sandboxNotFound', id)`), so its stable `code`, its HTTP
 * `status`, its message template and its `Retry-After` are decided in one place. Clients get
 * `{"error": message, "code": code}`; docs/api.md lists every code (a test checks the two agree)
 * and the SDKs turn codes into error classes.
 *
 * Several entries may share a code (every malformed request is `invalid_request`): the entry
 * is a message template, the code is what clients branch on. Layers throw these; only the api
 * layer turns them into HTTP responses. Messages never carry secrets (API keys) or host paths.
 */

/** A registry entry: what clients branch on, how it is rendered, and when to retry. */
export interface ErrorDef<A extends unknown[] = never[]> {
  readonly code: string;
  readonly status: number;
  readonly message: (...args: A) => string;
  /** Seconds after which a retry can work; sent as `Retry-After` (429 and 503 answers). */
  readonly retryAfterS?: number;
}

function def<A extends unknown[]>(
  code: string,
  status: number,
  message: (...args: A) => string,
  retryAfterS?: number,
): ErrorDef<A> {
  return retryAfterS === undefined
    ? { code, status, message }
    : { code, status, message, retryAfterS };
}

const show = (v: unknown): string => {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
};

export const Errors = {
  // --- 400: the request is wrong -----------------------------------------------------------
  /** A body that must be a JSON object is missing or is something else. */
  bodyNotObject: def('invalid_request', 400, (what: string) => `${what} must be a JSON object`),
  bodyNotJson: def('invalid_request', 400, (why: string) => `the body is not valid JSON: ${why}`),
  bodyNotAllowed: def('invalid_request', 400, (op: string) => `${op} takes no request body`),
  unknownField: def(
    'invalid_request',
    400,
    (field: string, allowed: readonly string[]) =>
      `unknown field "${field}" (allowed: ${allowed.join(', ')})`,
  ),
  /** A field (or query parameter) with a value outside what it accepts. */
  invalidField: def(
    'invalid_request',
    400,
    (field: string, expected: string, got: unknown) =>
      `${field} must be ${expected}, got ${show(got)}`,
  ),
  conflictingFields: def(
    'invalid_request',
    400,
    (a: string, b: string) => `give either ${a} or ${b}, not both`,
  ),
  /** A malformed request the HTTP framework rejected before any handler ran. */
  malformedRequest: def('invalid_request', 400, (why: string) => `malformed request: ${why}`),
  mergeIntoSelf: def('merge_into_self', 400, () => 'cannot merge a sandbox into itself'),
  /** A `network.allow_out` rule that does not parse; the message names it and why. */
  invalidEgressRule: def('invalid_request', 400, (why: string) => why),
  /** A tar upload that is not a tar stream (or is truncated). */
  invalidArchive: def(
    'invalid_archive',
    400,
    (path: string, why: string) => `not a valid tar archive for ${path}: ${why}`,
  ),
  /** A path for the files API that is not absolute, or holds NUL or `..` components. */
  invalidPath: def(
    'invalid_path',
    400,
    (path: string, why: string) => `invalid path ${show(path)}: ${why}`,
  ),
  isADirectory: def(
    'is_a_directory',
    400,
    (path: string, hint: string) => `${path} is a directory${hint}`,
  ),
  notADirectory: def('not_a_directory', 400, (path: string) => `${path} is not a directory`),

  // --- 403 ---------------------------------------------------------------------------------
  /** The guest refused a file operation (a read-only filesystem such as /proc, EACCES). */
  permissionDenied: def(
    'permission_denied',
    403,
    (path: string, why: string) => `permission denied on ${path}: ${why}`,
  ),

  // --- 401 ---------------------------------------------------------------------------------
  /** The contract fixes these two messages. */
  missingApiKey: def('missing_api_key', 401, () => 'missing Authorization: Bearer <key>'),
  invalidApiKey: def('invalid_api_key', 401, () => 'invalid api key'),

  // --- 404 / 410 ---------------------------------------------------------------------------
  /** Never existed, deleted, merged away, or malformed. */
  sandboxNotFound: def('sandbox_not_found', 404, (id: string) => `sandbox ${id} not found`),
  sandboxDeleted: def('sandbox_not_found', 404, (id: string) => `sandbox ${id} was deleted`),
  sandboxMergedAway: def(
    'sandbox_not_found',
    404,
    (id: string, into: string) => `sandbox ${id} was merged into ${into}`,
  ),
  /** Its VM died while hostd was down; the id answers this until it is deleted. */
  sandboxLost: def(
    'sandbox_lost',
    410,
    (id: string, why: string) => `sandbox ${id} was lost while hostd was not running: ${why}`,
  ),
  /** Cluster mode: its node stopped answering (no heartbeat within the lease TTL). */
  sandboxLostWithNode: def(
    'sandbox_lost',
    410,
    (id: string, node: string) =>
      `sandbox ${id} was lost with node ${node}, which stopped answering; delete it, or wait for ${node} to come back`,
  ),
  /** Cluster mode: its node recorded it lost (its VM died while that node was down). */
  sandboxLostOnNode: def(
    'sandbox_lost',
    410,
    (id: string, node: string, why: string) => `sandbox ${id} was lost on node ${node}: ${why}`,
  ),
  nodeNotFound: def('node_not_found', 404, (id: string) => `node ${id} is not in the cluster`),
  templateNotFound: def(
    'template_not_found',
    404,
    (name: string, known: readonly string[]) =>
      `template "${name}" does not exist (known: ${known.join(', ') || 'none'})`,
  ),
  snapshotNotFound: def('snapshot_not_found', 404, (id: string) => `snapshot ${id} not found`),
  fileNotFound: def('file_not_found', 404, (path: string) => `${path} does not exist`),
  routeNotFound: def(
    'route_not_found',
    404,
    (method: string, path: string) => `no route for ${method} ${path}`,
  ),

  // --- 409 ---------------------------------------------------------------------------------
  /** The cluster routes of a hostd that is not in cluster mode. */
  notClustered: def(
    'not_clustered',
    409,
    () => 'this hostd is not in cluster mode (SERVICE_CLUSTER_ETCD is not set)',
  ),
  /** A merge whose parent and winner are held by different nodes. */
  sandboxesOnDifferentNodes: def(
    'sandboxes_on_different_nodes',
    409,
    (parent: string, parentNode: string, winner: string, winnerNode: string) =>
      `cannot merge: ${parent} is on node ${parentNode} and ${winner} on node ${winnerNode}`,
  ),
  /** A catalog entry this node wrote was changed by another (deleted, handed over) meanwhile. */
  clusterConflict: def(
    'cluster_conflict',
    409,
    (id: string) => `the catalog entry of ${id} was changed by another node meanwhile`,
  ),

  // --- 413 / 415 ---------------------------------------------------------------------------
  bodyTooLarge: def(
    'body_too_large',
    413,
    (bytes: number | null, limit: number) =>
      `request body too large: ${bytes === null ? 'over' : `${bytes} bytes,`} limit ${limit} (SERVICE_MAX_BODY_BYTES)`,
  ),
  fileTooLarge: def(
    'file_too_large',
    413,
    (limit: number) => `file larger than the limit of ${limit} bytes (SERVICE_MAX_FILE_BYTES)`,
  ),
  unsupportedMediaType: def(
    'unsupported_media_type',
    415,
    (expected: string) => `Content-Type must be ${expected}`,
  ),

  // --- 429 ---------------------------------------------------------------------------------
  sandboxLimit: def(
    'limit_reached',
    429,
    (alive: number, requested: number, limit: number) =>
      `sandbox limit reached: ${alive} alive, ${requested} requested, limit ${limit} (SERVICE_MAX_SANDBOXES)`,
    1,
  ),
  queueFull: def(
    'limit_reached',
    429,
    (limit: number) =>
      `too many requests queued on this sandbox (limit ${limit}, SERVICE_MAX_QUEUED_EXECS)`,
    1,
  ),

  // --- 499: nobody hears it, but logs and metrics do ---------------------------------------
  requestAborted: def(
    'client_closed_request',
    499,
    (where: string) => `the client went away ${where}`,
  ),

  // --- 500 ---------------------------------------------------------------------------------
  vmStartFailed: def('executor_error', 500, (why: string) => `the VM failed to start: ${why}`),
  forkChildrenFailed: def(
    'executor_error',
    500,
    (failed: number, n: number, why: string) =>
      `${failed} of ${n} children could not start: ${why}`,
  ),
  vmOperationFailed: def(
    'executor_error',
    500,
    (operation: string, why: string) => `could not ${operation}: ${why}`,
  ),
  sandboxBroken: def(
    'executor_error',
    500,
    (id: string, why: string) => `sandbox ${id} is unusable: ${why}; delete it`,
  ),
  templateFailed: def(
    'template_failed',
    500,
    (name: string, why: string) => `template "${name}" failed to build: ${why}`,
  ),
  internal: def('internal_error', 500, (why: string) => `internal error: ${why}`),

  // --- 503 ---------------------------------------------------------------------------------
  insufficientResources: def('insufficient_resources', 503, (why: string) => why, 5),
  templateUnavailable: def(
    'template_unavailable',
    503,
    (name: string, why: string) => `template "${name}" is not available: ${why}`,
    10,
  ),
  shuttingDown: def('shutting_down', 503, () => 'hostd is shutting down'),
  /** Cluster mode: what needs the catalog (creates, forks, snapshots, moves) waits for etcd. */
  clusterUnavailable: def(
    'cluster_unavailable',
    503,
    (why: string) => `the cluster's catalog (etcd) cannot be reached: ${why}`,
    5,
  ),
  /** A paused sandbox (or snapshot) whose files are on a node that is down. */
  nodeUnavailable: def(
    'node_unavailable',
    503,
    (what: string, node: string) =>
      `${what} is on node ${node}, which is not serving; it is back when ${node} is`,
    10,
  ),
  /** A forwarded request whose node did not answer (it stopped a moment ago). */
  nodeUnreachable: def(
    'node_unavailable',
    503,
    (node: string, why: string) => `node ${node} did not answer: ${why}`,
    1,
  ),
  /** A sandbox being handed from one node to another (a drain); it serves again in seconds. */
  sandboxMoving: def(
    'sandbox_moving',
    503,
    (id: string, to: string) => `sandbox ${id} is moving to node ${to}`,
    1,
  ),
  /** A create sent to a node that stopped taking creates (it drains): the sender asks another. */
  nodeDraining: def(
    'node_draining',
    503,
    (node: string) => `node ${node} is draining and takes no new sandboxes`,
    1,
  ),
  /** No node of the cluster can take a create of this template now. */
  noNodeAvailable: def(
    'insufficient_resources',
    503,
    (template: string) =>
      `no node of the cluster serves template "${template}" and takes creates now`,
    5,
  ),

  // --- 507 ---------------------------------------------------------------------------------
  sandboxDiskFull: def(
    'sandbox_disk_full',
    507,
    (id: string) => `the disk of sandbox ${id} is full`,
  ),
  storageLimit: def(
    'storage_limit_reached',
    507,
    (usedMib: number, needMib: number, limitMib: number) =>
      `hostd's disk storage is full: ${usedMib} MiB used, ${needMib} MiB more needed, limit ${limitMib} MiB (SERVICE_MAX_STORAGE_MIB)`,
  ),
} as const;

export type ErrorName = keyof typeof Errors;
type ArgsOf<K extends ErrorName> = Parameters<(typeof Errors)[K]['message']>;

/** Every (code, status) pair clients can see: what docs/api.md must list. */
export function errorCodes(): Map<string, number> {
  return new Map(Object.values(Errors).map((d) => [d.code, d.status] as [string, number]));
}

/** A failure with a registry entry. Throw it from any layer; the api layer renders it. */
export class HostdError extends Error {
  /**
   * @param entry the registry entry's name, and `params` its arguments: what tests and logs
   *   inspect instead of parsing the message
   */
  constructor(
    readonly entry: ErrorName,
    readonly params: readonly unknown[],
    options?: { cause?: unknown },
  ) {
    const d = Errors[entry] as unknown as ErrorDef<unknown[]>;
    super(d.message(...params), options);
    this.name = 'HostdError';
  }

  get def(): ErrorDef<never[]> {
    return Errors[this.entry] as unknown as ErrorDef<never[]>;
  }

  get code(): string {
    return this.def.code;
  }

  get status(): number {
    return this.def.status;
  }

  get retryAfterS(): number | undefined {
    return this.def.retryAfterS;
  }

  /** The JSON body of the HTTP answer: the human-readable `error` plus the stable `code`. */
  toBody(): { error: string; code: string } {
    return { error: this.message, code: this.code };
  }
}

/** `fail('sandboxNotFound', id)`: the registry entry `name`, rendered with its arguments. */
export function fail<K extends ErrorName>(name: K, ...args: ArgsOf<K>): HostdError {
  return new HostdError(name, args);
}

/** The same, keeping what caused it (logged, never sent). */
export function failWith<K extends ErrorName>(
  cause: unknown,
  name: K,
  ...args: ArgsOf<K>
): HostdError {
  return new HostdError(name, args, { cause });
}

/** True when `err` is a HostdError made from entry `name`. */
export function isError(err: unknown, name: ErrorName): err is HostdError {
  return err instanceof HostdError && err.entry === name;
}

/** Wraps anything thrown into a HostdError, keeping HostdErrors as they are. */
export function toHostdError(err: unknown): HostdError {
  if (err instanceof HostdError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return failWith(err, 'internal', message);
}
