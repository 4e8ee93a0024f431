/**
 * Node-to-node calls of cluster mode over HTTP (core/cluster/hand-over.ts, PeerLink): a target
 * fetching an exported file of the source (`GET /v1/cluster/peer/files?path=`, resumed with
 * `Range: bytes=N-`), and a source offering a sandbox or a snapshot to a target (`POST
 * /v1/cluster/peer/sandboxes/{id}/hand-over`, `POST /v1/cluster/peer/snapshots/{id}/hand-over`). Both carry the cluster's key
 * (`X-Hostd-Cluster-Key`, SERVICE_CLUSTER_KEY) and, when the nodes have API keys, the first of
 * them as any client would, and the hop header: a peer route is never forwarded.
 */
import { Agent, request, type IncomingMessage } from 'node:http';
import { fail, HostdError } from '../errors.js';
import type {
  HandOverOffer,
  PeerLink,
  SnapshotExport,
  SnapshotOffer,
} from '../core/cluster/hand-over.js';
import { CLUSTER_KEY_HEADER, HOP_HEADER } from '../core/cluster/headers.js';
import type { NodeRecord } from '../core/cluster/records.js';
import type { SandboxInfo } from '../core/sandbox.js';
import type { SnapshotInfo } from '../core/snapshots.js';

/** How long a hand-over may take on the target (it fetches the sandbox's files). */
const OFFER_TIMEOUT_MS = 10 * 60_000;
/** How long a file's answer may be silent. */
const FILE_IDLE_MS = 60_000;

export class HttpPeers implements PeerLink {
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 16 });

  constructor(
    private readonly options: {
      /** This node's id (the hop header). */
      readonly self: string;
      readonly clusterKey: string;
      /** An API key of the nodes (they share them), or null when they have none. */
      readonly apiKey: string | null;
    },
  ) {}

  async fetchFile(
    from: NodeRecord,
    file: { readonly path: string; readonly size: number },
    offset: number,
  ): Promise<AsyncIterable<Uint8Array>> {
    const url = new URL('/v1/cluster/peer/files', from.url);
    url.searchParams.set('path', file.path);
    const res = await this.send('GET', url, from, null, FILE_IDLE_MS, {
      ...(offset > 0 ? { range: `bytes=${offset}-` } : {}),
    });
    const expected = offset > 0 ? 206 : 200;
    if (res.statusCode !== expected) {
      const body = await readAll(res);
      throw fail('nodeUnreachable', from.id, describe(res.statusCode ?? 0, body));
    }
    return res;
  }

  async offer(to: NodeRecord, offer: HandOverOffer): Promise<SandboxInfo> {
    const url = new URL(`/v1/cluster/peer/sandboxes/${offer.record.id}/hand-over`, to.url);
    const res = await this.send('POST', url, to, JSON.stringify(offer), OFFER_TIMEOUT_MS);
    const body = await readAll(res);
    if (res.statusCode !== 200) {
      throw fail(
        'handOverFailed',
        `sandbox ${offer.record.id}`,
        to.id,
        describe(res.statusCode ?? 0, body),
      );
    }
    return JSON.parse(body.toString('utf8')) as SandboxInfo;
  }

  async offerSnapshot(to: NodeRecord, offer: SnapshotOffer): Promise<SnapshotInfo> {
    const url = new URL(`/v1/cluster/peer/snapshots/${offer.record.id}/hand-over`, to.url);
    const res = await this.send('POST', url, to, JSON.stringify(offer), OFFER_TIMEOUT_MS);
    const body = await readAll(res);
    if (res.statusCode !== 200) {
      const what = `snapshot ${offer.record.id}`;
      throw fail('handOverFailed', what, to.id, describe(res.statusCode ?? 0, body));
    }
    return JSON.parse(body.toString('utf8')) as SnapshotInfo;
  }

  async exportSnapshot(from: NodeRecord, id: string): Promise<SnapshotExport> {
    const url = new URL(`/v1/cluster/peer/snapshots/${id}/export`, from.url);
    const res = await this.send('GET', url, from, null, FILE_IDLE_MS);
    const body = await readAll(res);
    if (res.statusCode !== 200) {
      throw fail('snapshotFetchFailed', id, from.id, describe(res.statusCode ?? 0, body));
    }
    return JSON.parse(body.toString('utf8')) as SnapshotExport;
  }

  close(): void {
    this.agent.destroy();
  }

  private send(
    method: string,
    url: URL,
    node: NodeRecord,
    body: string | null,
    timeoutMs: number,
    extra: Record<string, string> = {},
  ): Promise<IncomingMessage> {
    const headers: Record<string, string> = {
      [CLUSTER_KEY_HEADER]: this.options.clusterKey,
      [HOP_HEADER]: this.options.self,
      ...extra,
    };
    if (this.options.apiKey) headers.authorization = `Bearer ${this.options.apiKey}`;
    if (body !== null) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(Buffer.byteLength(body));
    }
    return new Promise((resolve, reject) => {
      const req = request(url, { method, headers, agent: this.agent, timeout: timeoutMs });
      req.on('response', resolve);
      req.on('timeout', () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
      req.on('error', (err) =>
        reject(err instanceof HostdError ? err : fail('nodeUnreachable', node.id, err.message)),
      );
      req.end(body ?? undefined);
    });
  }
}

async function readAll(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** A peer's error answer in words: its code and message (the registry's JSON body). */
function describe(status: number, body: Buffer): string {
  try {
    const e = JSON.parse(body.toString('utf8')) as { code?: unknown; error?: unknown };
    if (typeof e.code === 'string' && typeof e.error === 'string') return `${e.code}: ${e.error}`;
  } catch {
    // Expected: not a JSON body (a proxy's page); the status says enough.
  }
  return `HTTP ${status}`;
}
