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
  /**
   * Only the E2B front (docs/e2b.md) answers it: listed in docs/e2b.md, not docs/api.md, and
   * not among the native SDKs' error classes.
   */
  readonly e2bOnly?: true;
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

/** Longest rendering of a client's value in a message. */
const SHOWN_CHARS = 80;

/**
 * A client's value as a message quotes it: JSON-like, at most SHOWN_CHARS characters whatever
 * its size or depth. Never `JSON.stringify` a client's value whole: a body nested 200,000 deep
 * overflows the stack (a 500 for a 400), and a 4 MiB one makes a 4 MiB message.
 */
export function show(v: unknown): string {
  const s = preview(v, 3);
  return s.length > SHOWN_CHARS ? `${s.slice(0, SHOWN_CHARS - 3)}...` : s;
}

/** `v` rendered at most `depth` levels deep, stopping once a level passes SHOWN_CHARS. */
function preview(v: unknown, depth: number): string {
  if (typeof v === 'string') return JSON.stringify(v.slice(0, SHOWN_CHARS + 1));
  if (v === null || typeof v !== 'object') return String(v);
  const isArray = Array.isArray(v);
  const [open, close] = isArray ? ['[', ']'] : ['{', '}'];
  if (depth === 0) return `${open}...${close}`;
  let out = '';
  const add = (text: string): boolean => {
    out += `${out ? ',' : ''}${text}`;
    return out.length <= SHOWN_CHARS;
  };
  if (isArray) {
    for (let i = 0; i < v.length && add(preview(v[i], depth - 1)); i++);
  } else {
    for (const k in v) {
      if (!Object.hasOwn(v, k)) continue;
      const item = (v as Record<string, unknown>)[k];
      if (!add(`${preview(k, 0)}:${preview(item, depth - 1)}`)) break;
    }
  }
  return `${open}${out}${close}`;
}

/**
 * A name or path the client sent (an id in a URL, a field name, a guest path), as a message
 * quotes it: as it is when it is short, else cut to SHOWN_CHARS characters.
 */
export function clip(s: string, max = SHOWN_CHARS): string {
  return s.length > max ? `${s.slice(0, max - 3)}...` : s;
}

/** An entry only the E2B front answers (ErrorDef.e2bOnly). */
function e2bDef<A extends unknown[]>(
  code: string,
  status: number,
  message: (...args: A) => string,
): ErrorDef<A> {
  return { code, status, message, e2bOnly: true };
}

export const Errors = {
  // --- 400: the request is wrong -----------------------------------------------------------
  /** A body that must be a JSON object is missing or is something else. */
  bodyNotObject: def('invalid_request', 400, (what: string) => `${what} must be a JSON object`),
  bodyNotJson: def(
    'invalid_request',
    400,
    (why: string) => `the body is not valid JSON: ${clip(why, 200)}`,
  ),
  /** Nesting no request needs (every body is at most three levels deep), refused unread. */
  bodyTooDeep: def(
    'invalid_request',
    400,
    (max: number) => `the body is nested more than ${max} levels deep`,
  ),
  bodyNotAllowed: def('invalid_request', 400, (op: string) => `${op} takes no request body`),
  unknownField: def(
    'invalid_request',
    400,
    (field: string, allowed: readonly string[]) =>
      `unknown field ${show(field)} (allowed: ${allowed.join(', ')})`,
  ),
  /** A field (or query parameter) with a value outside what it accepts. */
  invalidField: def(
    'invalid_request',
    400,
    (field: string, expected: string, got: unknown) =>
      `${clip(field)} must be ${expected}, got ${show(got)}`,
  ),
  conflictingFields: def(
    'invalid_request',
    400,
    (a: string, b: string) => `give either ${a} or ${b}, not both`,
  ),
  /** A malformed request the HTTP framework rejected before any handler ran. */
  malformedRequest: def(
    'invalid_request',
    400,
    (why: string) => `malformed request: ${clip(why, 200)}`,
  ),
  mergeIntoSelf: def('merge_into_self', 400, () => 'cannot merge a sandbox into itself'),
  /** The default REPL context is the sandbox's own namespace: it can be restarted, not deleted. */
  contextIsDefault: def(
    'context_is_default',
    400,
    () => 'the default context cannot be deleted (restart it instead)',
  ),
  /** A `network.allow_out` rule that does not parse; the message names it and why. */
  invalidEgressRule: def('invalid_request', 400, (why: string) => why),
  /** A tar upload that is not a tar stream (or is truncated). */
  invalidArchive: def(
    'invalid_archive',
    400,
    (path: string, why: string) => `not a valid tar archive for ${clip(path)}: ${clip(why, 200)}`,
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
    (path: string, hint: string) => `${clip(path)} is a directory${hint}`,
  ),
  notADirectory: def('not_a_directory', 400, (path: string) => `${clip(path)} is not a directory`),
  /**
   * The file's kind or filesystem does not serve the operation: /proc/self/mem (EIO), a /sys
   * attribute (EINVAL), a device without its driver (ENXIO). `why` is hostd's own phrase.
   */
  unsupportedFile: def(
    'unsupported_file',
    400,
    (path: string, why: string) => `${clip(path)} cannot be read or written that way: ${why}`,
  ),
  /** A user name the sandbox has no account for (processes, files as a user). */
  unknownUser: e2bDef('unknown_user', 400, (name: string) => `invalid username: '${name}'`),
  /** A process's working directory that does not exist (the message is E2B's envd's). */
  invalidCwd: e2bDef('invalid_cwd', 400, (path: string) => `cwd '${path}' does not exist`),
  /**
   * The guest could not execute a process's program. The guest's own words (which a guest may
   * make anything) go to the log with the sandbox id, not to the client.
   */
  processStartFailed: e2bDef(
    'process_start_failed',
    400,
    () => 'the process could not start: its program could not be executed',
  ),
  /** A process request the guest refused as malformed (an environment variable named "A=B"). */
  invalidProcessRequest: def('invalid_request', 400, (why: string) => why),

  // --- 403 ---------------------------------------------------------------------------------
  /** The guest refused a file operation (a read-only filesystem such as /proc, EACCES). */
  permissionDenied: def(
    'permission_denied',
    403,
    (path: string, why: string) => `permission denied on ${clip(path)}: ${clip(why, 200)}`,
  ),

  // --- 401 ---------------------------------------------------------------------------------
  /** The contract fixes these two messages. */
  missingApiKey: def('missing_api_key', 401, () => 'missing Authorization: Bearer <key>'),
  invalidApiKey: def('invalid_api_key', 401, () => 'invalid api key'),
  /** The E2B front's control plane (docs/e2b.md) takes its key in `X-API-KEY`. */
  /** A node-to-node route (a peer's file fetch, a hand-over) without the cluster's key. */
  invalidClusterKey: def(
    'invalid_api_key',
    401,
    () => 'missing or invalid X-Hostd-Cluster-Key (a route between nodes of a cluster)',
  ),
  missingE2bApiKey: def('missing_api_key', 401, () => 'missing X-API-KEY header'),
  /**
   * E2B sandbox traffic without that sandbox's own access token (docs/e2b.md, Auth). The message
   * is envd's, which E2B's users know.
   */
  invalidAccessToken: e2bDef(
    'invalid_access_token',
    401,
    () => 'unauthorized access, please provide a valid access token or method signing if supported',
  ),
  /** An E2B signed `/files` URL whose signature is missing, wrong or expired (envd's words). */
  invalidSignature: e2bDef('invalid_signature', 401, (why: string) => why),

  // --- 404 / 410 ---------------------------------------------------------------------------
  /** Never existed, deleted, merged away, or malformed. */
  sandboxNotFound: def('sandbox_not_found', 404, (id: string) => `sandbox ${clip(id)} not found`),
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
  /** Forgetting a node that holds its lease (docs/cluster.md, A node gone for good). */
  nodeAlive: def(
    'cluster_conflict',
    409,
    (id: string) => `node ${id} is alive: only a node that is down can be forgotten`,
  ),
  /**
   * Undraining a node that is down (docs/cluster.md, Undrain): there is no node to ask, and a
   * node starts `serving` when it comes back.
   */
  nodeDown: def(
    'cluster_conflict',
    409,
    (id: string) => `node ${id} is down: it takes creates again when it restarts`,
  ),
  /**
   * Undraining a node whose hostd stops (SIGTERM, SIGINT; docs/cluster.md, Undrain): it refuses
   * creates until it is gone, so it stays `draining`; it is `serving` when it restarts.
   */
  nodeStopping: def(
    'cluster_conflict',
    409,
    (id: string) => `node ${id} is stopping: it takes creates again when it restarts`,
  ),
  templateNotFound: def(
    'template_not_found',
    404,
    (name: string, known: readonly string[]) =>
      `template ${show(name)} does not exist (known: ${known.join(', ') || 'none'})`,
  ),
  snapshotNotFound: def(
    'snapshot_not_found',
    404,
    (id: string) => `snapshot ${clip(id)} not found`,
  ),
  fileNotFound: def('file_not_found', 404, (path: string) => `${clip(path)} does not exist`),
  /** A peer asked for a file no export of this node names (or that is gone since). */
  peerFileNotFound: def(
    'file_not_found',
    404,
    () => 'the file asked is not one this node exports (the sandbox moved or resumed meanwhile)',
  ),
  /** E2B's polling watcher (CreateWatcher) that does not exist, or was removed. */
  watcherNotFound: e2bDef(
    'watcher_not_found',
    404,
    (id: string) => `watcher with id ${id} not found`,
  ),
  /** No running process has that pid (or tag); E2B's envd words it the same way. */
  processNotFound: e2bDef(
    'process_not_found',
    404,
    (what: string) => `process with ${what} not found`,
  ),
  contextNotFound: def(
    'context_not_found',
    404,
    (id: string, context: string) => `sandbox ${id} has no context ${context}`,
  ),
  routeNotFound: def(
    'route_not_found',
    404,
    (method: string, path: string) => `no route for ${clip(method)} ${clip(path)}`,
  ),

  // --- 408 ---------------------------------------------------------------------------------
  /** The request's headers did not all arrive in time (Node's `headersTimeout`). */
  requestTimeout: def(
    'request_timeout',
    408,
    () => 'the request did not arrive in time; the connection is closed',
  ),

  // --- 409 ---------------------------------------------------------------------------------
  /** Input to a process started without stdin, or after its stdin was closed. */
  stdinClosed: e2bDef(
    'stdin_closed',
    409,
    (what: string) =>
      `the stdin of the process with ${what} is not open (start it with stdin, and write before closing it)`,
  ),
  /** A process or watch stream that ended because the sandbox's machine went away. */
  streamInterrupted: e2bDef(
    'stream_interrupted',
    409,
    (why: string) => `the stream ended before its process: ${why}`,
  ),
  /** A sandbox restored from a state made before machines had the processes port. */
  processesUnavailable: e2bDef(
    'processes_unavailable',
    409,
    (id: string) =>
      `sandbox ${id} was made by an earlier hostd, whose machines cannot run processes; create a new sandbox`,
  ),
  /** E2B's MakeDir of a directory that exists (the SDK's makeDir then answers false). */
  directoryExists: e2bDef(
    'already_exists',
    409,
    (path: string) => `directory ${path} already exists`,
  ),
  contextExists: def(
    'context_exists',
    409,
    (id: string, context: string) => `sandbox ${id} already has a context ${context}`,
  ),
  /** E2B's pause of a sandbox that is paused already (the native pause is a no-op instead). */
  sandboxAlreadyPaused: e2bDef(
    'sandbox_paused',
    409,
    (id: string) => `sandbox ${id} is already paused`,
  ),
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

  // --- 413 / 415 / 431 ---------------------------------------------------------------------
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
  /** The guest's filesystem refused to grow a file that large (EFBIG). */
  sandboxFileTooLarge: def(
    'file_too_large',
    413,
    (path: string) => `${path} would be larger than the sandbox's filesystem allows`,
  ),
  unsupportedMediaType: def(
    'unsupported_media_type',
    415,
    (expected: string) => `Content-Type must be ${expected}`,
  ),

  /** Request line and headers over Node's limit (16 KiB): an absurdly long URL, mostly. */
  headersTooLarge: def(
    'headers_too_large',
    431,
    (limitBytes: number) =>
      `the request line and headers are over the limit of ${limitBytes} bytes`,
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
  /**
   * A bug in hostd. What went wrong is logged with the request id: the raw text can name host
   * paths (an fs error's) and is not the client's business.
   */
  internal: def(
    'internal_error',
    500,
    (requestId: string) => `internal error; hostd's log has the details (request ${requestId})`,
  ),

  // --- 501 / 502 ---------------------------------------------------------------------------
  /** An E2B SDK method or option hostd does not offer (docs/e2b.md says which and why). */
  notSupported: e2bDef(
    'not_supported',
    501,
    (what: string, why: string) => `${what} is not supported by hostd: ${why}`,
  ),
  /**
   * E2B sandbox traffic for a sandbox that is not running (killed, expired, paused, unknown): the
   * E2B SDKs read a 502 as "not running" (isRunning() is false). The message is E2B's own.
   */
  sandboxNotRunning: e2bDef(
    'sandbox_not_running',
    502,
    (_id: string) => 'The sandbox was not found',
  ),
  /** An E2B stream (a command, a watch) past its `Connect-Timeout-Ms`. */
  deadlineExceeded: e2bDef(
    'deadline_exceeded',
    504,
    (what: string, ms: number) => `${what} ran past its timeout of ${ms} ms`,
  ),

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
  /**
   * A sandbox (or a snapshot) being handed from one node to another (a drain); it serves again
   * in seconds. `what` is `sandbox <id>` or `snapshot <id>`.
   */
  sandboxMoving: def(
    'sandbox_moving',
    503,
    (what: string, to: string) => `${what} is moving to node ${to}`,
    1,
  ),
  /**
   * A hand-over of a sandbox (or a snapshot) to another node that did not complete: it stays
   * where it was. `what` is `sandbox <id>` or `snapshot <id>`.
   */
  handOverFailed: def(
    'hand_over_failed',
    503,
    (what: string, node: string, why: string) =>
      `${what} could not be handed over to node ${node}: ${why}`,
    5,
  ),
  /**
   * A create placed on a node that does not hold the snapshot, whose files it could not fetch
   * from a node holding them: the create is asked of the next node.
   */
  snapshotFetchFailed: def(
    'hand_over_failed',
    503,
    (id: string, node: string, why: string) =>
      `snapshot ${id} could not be copied from node ${node}: ${why}`,
    5,
  ),
  /** A create sent to a node that stopped taking creates (it drains): the sender asks another. */
  nodeDraining: def(
    'node_draining',
    503,
    (node: string) => `node ${node} is draining and takes no new sandboxes`,
    1,
  ),
  /**
   * No node of the cluster can take a create of this template now, though a live node serves
   * it (one known to none is template_not_found, one served only by a down node node_unavailable).
   */
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

/**
 * Every (code, status) pair clients can see: of the native API (what docs/api.md lists), or of
 * entries only the E2B front answers (what docs/e2b.md lists).
 */
export function errorCodes(which: 'native' | 'e2b' = 'native'): Map<string, number> {
  const defs = Object.values(Errors) as ErrorDef<never[]>[];
  const picked = defs.filter((d) => (which === 'e2b') === (d.e2bOnly === true));
  return new Map(picked.map((d) => [d.code, d.status] as [string, number]));
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

/**
 * Wraps anything thrown into a HostdError, keeping HostdErrors as they are; anything else is a
 * bug, `internal`, whose message names only `requestId` (log `err` with it).
 */
export function toHostdError(err: unknown, requestId: string): HostdError {
  if (err instanceof HostdError) return err;
  return failWith(err, 'internal', requestId);
}
