/**
 * Sandboxes in tests: created through the API, always deleted, reported when a test fails (the
 * sandbox id and its VM log tail), and observed through `GET /v1/sandboxes/{id}` rather than
 * by timing: an exec is running when the sandbox is `busy`, a request waits when it is
 * `queued`, a VM died when the sandbox is `failed`.
 */
import { eventually } from './eventually.js';
import type { Api, Hostd } from './hostd.js';

/** What `GET /v1/sandboxes/{id}` returns (docs/api.md). */
export interface SandboxInfo {
  id: string;
  state: 'ready' | 'paused' | 'failed';
  template: string;
  created_at: string;
  last_used_at: string;
  parent_id: string | null;
  snapshot_id: string | null;
  busy: boolean;
  queued: number;
  error: string | null;
  network: { allow_out: string[]; bytes_out: number; bytes_in: number };
  memory_mib: number | null;
  merged_from: { id: string; merged_at: string }[];
  metadata: Record<string, string>;
  timeout: number | null;
  on_timeout: 'delete' | 'pause' | null;
  expires_at: string | null;
  paused_by: 'request' | 'lifetime' | 'idle' | 'shutdown' | null;
}

export async function createSandbox(api: Api, body: unknown = {}): Promise<string> {
  const res = await api.json<{ id: string; state: string }>('POST', '/v1/sandboxes', body);
  if (res.status !== 200)
    throw new Error(`create returned ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body.id;
}

export async function sandboxInfo(api: Api, id: string): Promise<SandboxInfo> {
  const res = await api.json<SandboxInfo>('GET', `/v1/sandboxes/${id}`);
  if (res.status !== 200)
    throw new Error(`GET sandbox ${id} returned ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body;
}

/**
 * Resolves with the sandbox's description once `holds` is true of it.
 * @example await untilSandbox(hostd, id, 'a request to queue', (s) => s.queued === 1);
 */
export async function untilSandbox(
  api: Api,
  id: string,
  what: string,
  holds: (info: SandboxInfo) => boolean,
): Promise<SandboxInfo> {
  return eventually(
    `${what} on ${id}`,
    async () => {
      const info = await sandboxInfo(api, id);
      return holds(info) ? info : null;
    },
    { timeoutMs: 60_000, everyMs: 20 },
  );
}

/** The sandboxes of one test: `create` makes one, `track` adopts ids made otherwise (forks). */
export interface SandboxScope {
  create(body?: unknown): Promise<string>;
  track<T extends string | string[]>(ids: T): T;
}

/**
 * Runs `fn` with a scope of sandboxes; on failure prints every tracked sandbox's id and VM log
 * tail with hostd's log tail, and always deletes them all (ids already gone are fine).
 */
export async function withSandboxes(
  hostd: Hostd,
  fn: (scope: SandboxScope) => Promise<void>,
): Promise<void> {
  const made: string[] = [];
  const scope: SandboxScope = {
    async create(body) {
      const id = await createSandbox(hostd, body);
      made.push(id);
      return id;
    },
    track(ids) {
      made.push(...(typeof ids === 'string' ? [ids] : ids));
      return ids;
    },
  };
  try {
    await fn(scope);
  } catch (err) {
    for (const id of made) await reportSandbox(hostd, id);
    reportHostdTail(hostd);
    throw err;
  } finally {
    await Promise.all(
      made.map((id) => hostd.request('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined)),
    );
  }
}

/** Runs `fn` with one fresh sandbox, as withSandboxes. */
export async function withSandbox(hostd: Hostd, fn: (id: string) => Promise<void>): Promise<void> {
  await withSandboxes(hostd, async (scope) => fn(await scope.create()));
}

/** Prints sandbox `id` and the tail of its VM's console and QEMU log, then hostd's log tail. */
export async function reportFailure(hostd: Hostd, id: string): Promise<void> {
  await reportSandbox(hostd, id);
  reportHostdTail(hostd);
}

async function reportSandbox(hostd: Hostd, id: string): Promise<void> {
  const res = await hostd.request('GET', `/v1/sandboxes/${id}/logs`).catch(() => null);
  const tail = res ? `(${res.status}) ${await res.text()}` : '(no logs)';
  console.error(`\n=== test failed on sandbox ${id} ===\n${tail}`);
}

function reportHostdTail(hostd: Hostd): void {
  console.error(`=== hostd log tail ===\n${hostd.logs.slice(-20).join('\n')}\n`);
}
