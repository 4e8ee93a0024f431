// Generated from docs/openapi.json (components.schemas) by scripts/gen-sdk-types.ts: do not edit.
// Regenerate with `npm run gen:sdk-types`; `npm run gen:sdk-types -- --check` (CI) fails when stale.
// The fields SDK_OPTIONAL (there) names for TypeScript are optional here.

export type paths = Record<string, never>;
export type webhooks = Record<string, never>;
export interface components {
  schemas: {
    /** @description The body of every non-2xx response: the contract's `error` message plus the stable `code` clients branch on (docs/api.md, Errors). Any route may also answer what Node's HTTP parser refuses before a route is chosen: 400 `invalid_request` (not HTTP), 408 `request_timeout` (headers too slow), 431 `headers_too_large` (request line and headers over 16 KiB). */
    Error: {
      /** @description A human-readable message; may change between versions. */
      error: string;
      /**
       * @description A stable machine-readable code.
       * @enum {string}
       */
      code:
        | 'body_too_large'
        | 'client_closed_request'
        | 'cluster_conflict'
        | 'cluster_unavailable'
        | 'context_exists'
        | 'context_is_default'
        | 'context_not_found'
        | 'executor_error'
        | 'file_not_found'
        | 'file_too_large'
        | 'hand_over_failed'
        | 'headers_too_large'
        | 'insufficient_resources'
        | 'internal_error'
        | 'invalid_api_key'
        | 'invalid_archive'
        | 'invalid_path'
        | 'invalid_request'
        | 'is_a_directory'
        | 'limit_reached'
        | 'merge_into_self'
        | 'missing_api_key'
        | 'node_draining'
        | 'node_not_found'
        | 'node_unavailable'
        | 'not_a_directory'
        | 'not_clustered'
        | 'permission_denied'
        | 'request_timeout'
        | 'route_not_found'
        | 'sandbox_disk_full'
        | 'sandbox_lost'
        | 'sandbox_moving'
        | 'sandbox_not_found'
        | 'sandboxes_on_different_nodes'
        | 'shutting_down'
        | 'snapshot_not_found'
        | 'storage_limit_reached'
        | 'template_failed'
        | 'template_not_found'
        | 'template_unavailable'
        | 'unsupported_file'
        | 'unsupported_media_type';
    };
    /** @description `sbx_` + 32 lowercase hex characters from a CSPRNG. */
    SandboxId: string;
    /** @description A ready sandbox, as returned by create and in fork children. */
    Sandbox: {
      id: components['schemas']['SandboxId'];
      /** @constant */
      state: 'ready';
    };
    /** @description A sandbox as listed and described. */
    SandboxInfo: {
      id: components['schemas']['SandboxId'];
      /**
       * @description `ready` runs; `paused` is written to disk (resumed by the next operation); `failed`: its VM died (`error` says why).
       * @enum {string}
       */
      state: 'ready' | 'paused' | 'failed';
      /** @description Template the sandbox (or its VM) came from. */
      template: string;
      /** Format: date-time */
      created_at: string;
      /** Format: date-time */
      last_used_at: string;
      /** @description The sandbox a fork child came from (it may have been deleted since); null otherwise. */
      parent_id: components['schemas']['SandboxId'] | null;
      /** @description True while an exec, fork, merge, snapshot or pause holds the sandbox. */
      busy: boolean;
      /** @description Requests waiting behind the one holding the sandbox. */
      queued: number;
      /** @description The snapshot the sandbox was created from, if any. */
      snapshot_id?: string | null;
      /** @description Why the sandbox failed, when `state` is `failed`. */
      error?: string | null;
      /** @description The sandbox's egress rules and the bytes its connections sent and received (docs/api.md, Network). */
      network?: {
        allow_out: string[];
        bytes_out: number;
        bytes_in: number;
      };
      /** @description Host memory (MiB) that is this sandbox's own: its QEMU's anonymous resident memory (pages it wrote, the TCG translation buffer, QEMU's heap), not the pages it still shares with its template or fork point. `null` while paused or failed. */
      memory_mib?: number | null;
      /** @description The sandboxes merged into this one (their ids are gone since), oldest first; the 64 most recent. */
      merged_from?: {
        id: components['schemas']['SandboxId'];
        /** Format: date-time */
        merged_at: string;
      }[];
      /** @description The labels given at create (`{}` without). */
      metadata?: {
        [key: string]: string;
      };
      /** @description Its lifetime in seconds of running time; null: none. */
      timeout?: number | null;
      /**
       * @description What happens when its lifetime is up; null without one.
       * @enum {string|null}
       */
      on_timeout?: 'delete' | 'pause' | null;
      /**
       * Format: date-time
       * @description When a running sandbox's lifetime ends; null while paused or without one.
       */
      expires_at?: string | null;
      /**
       * @description Why a paused sandbox is paused (a pause call, its lifetime, the idle timeout, hostd's shutdown); null while it runs.
       * @enum {string|null}
       */
      paused_by?: 'request' | 'lifetime' | 'idle' | 'shutdown' | null;
      /** @description Cluster mode only: the node that holds the sandbox (docs/cluster.md). Absent on a single hostd. */
      node?: string;
    };
    SandboxList: {
      sandboxes: components['schemas']['SandboxInfo'][];
    };
    CreateRequest: {
      /** @description Template name; absent or null means the default template (the first of `GET /v1/templates`: `python` unless `SERVICE_TEMPLATES` says otherwise). */
      template?: string | null;
      /** @description Create the sandbox from this snapshot (`snap_…`) instead of a template; not together with `template`. */
      snapshot?: string | null;
      /** @description The sandbox's default environment: bash's environment and Python's `os.environ`; fork children inherit it. */
      env?: {
        [key: string]: string;
      } | null;
      /** @description Outbound network access; absent means none. */
      network?: {
        /** @description Egress rules (docs/api.md, Network): `host`, `host:port`, `*.domain`, CIDR, IP, `*`, `host.hostd.internal:PORT`. */
        allow_out?: string[];
      } | null;
      /** @description Labels of yours (at most 64, 16 KiB in all), shown in the sandbox and kept with it; fork children inherit them. */
      metadata?: {
        [key: string]: string;
      } | null;
      /** @description A lifetime: seconds of running time, after which the sandbox is deleted (or paused, `on_timeout`). Pausing stops the clock; each resume gives the whole lifetime again (docs/api.md, Metadata and lifetime). */
      timeout?: number | null;
      /**
       * @description What happens when the lifetime is up (default `delete`); only with `timeout`.
       * @enum {string|null}
       */
      on_timeout?: 'delete' | 'pause' | null;
    };
    ExecRequest: {
      /** @description The code to run; at most the body limit (4 MiB by default). */
      code: string;
      /**
       * @description Absent or null means `python`.
       * @default python
       * @enum {unknown}
       */
      language?: 'python' | 'bash' | null;
      /** @description Seconds after which the code is interrupted (exit `124`). Absent or null means no timeout. */
      timeout?: number | null;
      /** @description Extra environment variables for this exec, over the sandbox's `env`. */
      env?: {
        [key: string]: string;
      } | null;
      /** @description Absolute working directory for this exec (default `/root`); a missing one ends the exec with exit 1 and a stderr line. */
      cwd?: string | null;
      /**
       * @description Python: emit rich outputs (figures, tables) as `display` events.
       * @default false
       */
      display?: boolean | null;
      /** @description Python only: the REPL context to run in (see `Context`); absent or null means the default context. One the sandbox does not have is `404 context_not_found`, answered before any stream. */
      context?: string | null;
      /**
       * @description Python only: run as a notebook cell (docs/api.md, Notebook mode): the first event is `execution_count`, the value of the last expression is a `result` event, an uncaught exception an `error` event, rich outputs are on, IPython's `!cmd` and `%magic` lines work and an indented cell is dedented.
       * @default false
       */
      notebook?: boolean | null;
    };
    /**
     * @description One line of the exec NDJSON stream. `seq` starts at 0 and increases by one per event of the exec; `ts` is host wall-clock time in ms.
     * @example {
     *       "type": "stdout",
     *       "data": "hello",
     *       "seq": 0,
     *       "ts": 1763640000123
     *     }
     * @example {
     *       "type": "exit",
     *       "data": 0,
     *       "seq": 1,
     *       "ts": 1763640000124
     *     }
     * @example {
     *       "type": "exit",
     *       "data": -1,
     *       "error": "the VM exited (signal SIGKILL)",
     *       "seq": 4,
     *       "ts": 1763640000200
     *     }
     */
    ExecEvent:
      | {
          /** @enum {unknown} */
          type: 'stdout' | 'stderr';
          data: string;
          seq: number;
          ts: number;
          /**
           * @description Notebook cells only: the data does not end its line (a last line without its newline, a piece of a long line).
           * @constant
           */
          partial?: true;
        }
      | {
          /** @constant */
          type: 'display';
          data: {
            [key: string]: unknown;
          };
          seq: number;
          ts: number;
        }
      | {
          /** @constant */
          type: 'execution_count';
          data: number;
          seq: number;
          ts: number;
        }
      | {
          /** @constant */
          type: 'result';
          data: {
            [key: string]: unknown;
          };
          seq: number;
          ts: number;
        }
      | {
          /** @constant */
          type: 'error';
          data: components['schemas']['CellError'];
          seq: number;
          ts: number;
        }
      | {
          /** @constant */
          type: 'exit';
          data: number;
          seq: number;
          ts: number;
        }
      | {
          /** @constant */
          type: 'exit';
          /** @constant */
          data: -1;
          /** @description The reason. */
          error: string;
          seq: number;
          ts: number;
        };
    ForkRequest: {
      /** @description Number of children; required, no default. */
      n: number;
    };
    ForkResponse: {
      parent_id: components['schemas']['SandboxId'];
      /** @description In no particular order; each child is ready. */
      children: components['schemas']['Sandbox'][];
    };
    MergeResponse: {
      /** @description The parent id, now driving the winner's VM. */
      id: components['schemas']['SandboxId'];
      /** @constant */
      state: 'ready';
      /** @description The winner id, which is gone. */
      merged: components['schemas']['SandboxId'];
    };
    /** @description A snapshot: a sandbox's whole state kept on disk. */
    Snapshot: {
      /** @example snap_0123456789abcdef0123456789abcdef */
      snapshot_id: string;
      /** @description The sandbox it was taken from (it may be gone). */
      source_sandbox_id: string;
      template: string;
      /** @description Disk space it takes. */
      size_bytes: number;
      /** Format: date-time */
      created_at: string;
      /** @description Sandboxes created from it that still exist. */
      sandboxes: number;
      /** @description The name it was given at snapshot, if any (not unique). */
      name?: string | null;
    };
    SnapshotList: {
      snapshots: components['schemas']['Snapshot'][];
    };
    /** @description `POST /v1/sandboxes/{id}/snapshot`: no body, `{}`, or a name. */
    SnapshotRequest: {
      /** @description A name of yours (printable ASCII; need not be unique). */
      name?: string | null;
    };
    SandboxState: {
      id: components['schemas']['SandboxId'];
      /** @enum {string} */
      state: 'ready' | 'paused';
    };
    /** @description `POST /v1/sandboxes/{id}/timeout`: a running sandbox's new lifetime. */
    TimeoutRequest: {
      /** @description Seconds from now; null removes the lifetime. */
      timeout: number | null;
      /**
       * @description What happens when the lifetime is up; absent or null keeps the current choice.
       * @enum {string|null}
       */
      on_timeout?: 'delete' | 'pause' | null;
    };
    Template: {
      /** @description What `POST /v1/sandboxes` takes as `template`. */
      name: string;
      /** @description True for the template a create without `template` gets (the first). */
      default: boolean;
      /**
       * @description `building`: creates get `503 template_unavailable` with `Retry-After`; `failed`: creates get `500 template_failed` with `error`.
       * @enum {string}
       */
      state: 'building' | 'ready' | 'failed';
      /** @description Why the template failed (a recipe error, or the failing build step and the end of its log); null otherwise. */
      error: string | null;
      /** @description Guest RAM of each VM: the recipe's unless configuration overrides it. */
      memory_mib: number;
      vcpus: number;
      /** @description VMs kept restored and ready. */
      pool_size: number;
      /** @description Size of each VM's writable disk. */
      disk_mib: number;
      description: string;
      /** @description Modules already imported in every sandbox's REPL. */
      preload: string[];
      /** @description Debian packages: once built, the recipe's and every template's base packages; before, the recipe's. */
      debian_packages: string[];
      /** @description What pip installed (dependencies included) once built; before, the recipe's requirements. */
      python_packages: string[];
      /** @description Identifies the build; null until built. */
      image_key: string | null;
      /**
       * Format: date-time
       * @description When the image was built; null until built.
       */
      built_at: string | null;
    };
    TemplateList: {
      templates: components['schemas']['Template'][];
    };
    /** @description A file, directory, symbolic link or other entry of a sandbox. */
    FileEntry: {
      name: string;
      path: string;
      /** @enum {string} */
      type: 'file' | 'dir' | 'symlink' | 'other';
      size: number;
      /** @description Permission bits, e.g. 420 for 0644. */
      mode: number;
      /** @description Modification time, milliseconds since the epoch. */
      mtime_ms: number;
      /** @description Symbolic links only: where it points. */
      target?: string | null;
    };
    FileWritten: {
      path: string;
      size: number;
      /** @description Tar uploads: members extracted, directories included. */
      files?: number;
    };
    /** @description A notebook cell's uncaught exception. */
    CellError: {
      /** @description The exception's class name, e.g. `NameError`. */
      name: string;
      /** @description Its message (`str(exception)`). */
      value: string;
      /** @description The traceback as Python prints it, without hostd's own frames. */
      traceback: string;
    };
    /** @description A REPL context (docs/api.md, Contexts): an independent namespace with its own working directory and execution count. */
    Context: {
      /** @example default */
      id: string;
      /** @description Its working directory. */
      cwd: string;
      /** @description Notebook cells it has run. */
      execution_count: number;
    };
    ContextList: {
      /** @description `default` first, then in creation order. */
      contexts: components['schemas']['Context'][];
    };
    ContextCreateRequest: {
      /** @description The context's id; absent or null: 16 random hex digits. */
      id?: string | null;
      /** @description An existing directory; absent or null: the default context's directory. */
      cwd?: string | null;
    };
    /** @description A node's last drain since it started. One that ended with something left (`left` or `snapshots_left` > 0) leaves the node `draining`: it takes no creates, and will not become `drained` by itself; draining it again retries what is left; undraining it returns it to `serving`. */
    DrainReport: {
      /** @description When this round started (each drain is one). */
      started_at: string;
      /** @description When it ended; null while it runs (its counts grow). */
      ended_at: string | null;
      /** @description Sandboxes it handed to other nodes. */
      moved: number;
      /** @description Sandboxes still on the node when it ended (failed ones, and those no node took); null while it runs. */
      left: number | null;
      /** @description Snapshots it handed over, or left to another node holding a copy. */
      snapshots_moved: number;
      /** @description Snapshots still on the node when it ended; null while it runs. */
      snapshots_left: number | null;
      /** @description The ids of the sandboxes counted in `left`, sorted, at most 100 (`left` is the count that holds); null while it runs. Absent from reports of nodes older than it. */
      left_sandboxes?: string[] | null;
      /** @description The ids of the snapshots counted in `snapshots_left`, sorted, at most 100; null while it runs. Absent from reports of older nodes. */
      left_snapshots?: string[] | null;
      /** @description When `POST /v1/cluster/nodes/{id}/undrain` returned the node to `serving` during or after this round (a running round then starts no further move); null when none has. Absent from reports of older nodes. */
      undrained_at?: string | null;
    };
    /** @description A node of the cluster as `GET /v1/cluster` shows it. */
    ClusterNode: {
      id: string;
      /** @description Where peers and the proxy reach it; null for a node that is down. */
      url: string | null;
      /**
       * @description `serving` takes creates; `draining` takes none and hands its sandboxes and snapshots to other nodes; `drained`: a drain moved all its sandboxes and snapshots away; `down`: its lease expired while sandboxes still name it.
       * @enum {string}
       */
      state: 'serving' | 'draining' | 'drained' | 'down';
      version: string | null;
      started_at: string | null;
      /** @description Sandboxes running there now; for a down node, those the catalog still gives it. */
      sandboxes: number;
      capacity: Record<string, unknown> | null;
      load: Record<string, unknown> | null;
      templates: Record<string, unknown>;
      /** @description Its last drain since it started, running or ended; null when it has not drained since, or is down. */
      drain: components['schemas']['DrainReport'] | null;
    };
    /** @description The cluster as the answering node sees it; `enabled: false` on a single hostd. */
    ClusterInfo: {
      enabled: boolean;
      /** @description The node that answered. */
      node: string | null;
      etcd: {
        connected?: boolean;
        pending_writes?: number;
      } | null;
      nodes: components['schemas']['ClusterNode'][];
    };
  };
  responses: never;
  parameters: never;
  requestBodies: never;
  headers: never;
  pathItems: never;
}
export type $defs = Record<string, never>;
export type operations = Record<string, never>;
