/**
 * The coordination store of cluster mode (core/cluster/kv.ts) on etcd, through the `etcd3`
 * client: every key under `/hostd/`, compare-and-set transactions on modification revisions, the
 * node's lease kept alive by the client, one watch of the whole prefix.
 *
 * Every call is bounded (`callTimeoutMs`): with etcd unreachable, what needs the catalog fails
 * within seconds with a clear error instead of hanging the client's request, and the callers
 * that must not lose a write (core/cluster/catalog-writer.ts) retry on their own.
 */
import { Etcd3, type IKeyValue, type Lease, type Watcher } from 'etcd3';
import type {
  ClusterKv,
  KvCompare,
  KvEntry,
  KvOp,
  TxnResult,
  WatchHandlers,
} from '../core/cluster/kv.js';

export const ETCD_PREFIX = '/hostd/';

export interface EtcdKvOptions {
  /** Client URLs of the members (SERVICE_CLUSTER_ETCD). */
  readonly endpoints: readonly string[];
  /** The longest any single call may take. */
  readonly callTimeoutMs?: number;
  readonly prefix?: string;
}

export class EtcdKv implements ClusterKv {
  private readonly client: Etcd3;
  private readonly prefix: string;
  private readonly timeoutMs: number;
  private lease: Lease | null = null;
  private leaseId: string | null = null;

  constructor(options: EtcdKvOptions) {
    this.prefix = options.prefix ?? ETCD_PREFIX;
    this.timeoutMs = options.callTimeoutMs ?? 4000;
    this.client = new Etcd3({
      hosts: [...options.endpoints],
      dialTimeout: this.timeoutMs,
      defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + this.timeoutMs }),
    });
  }

  async list(prefix: string): Promise<{ entries: KvEntry[]; revision: number }> {
    const res = await this.bounded(
      'read the catalog',
      this.client
        .getAll()
        .prefix(this.prefix + prefix)
        .exec(),
    );
    return {
      entries: res.kvs.map((kv) => this.entry(kv)),
      revision: Number(res.header.revision),
    };
  }

  async get(key: string): Promise<KvEntry | null> {
    const res = await this.bounded('read the catalog', this.client.get(this.prefix + key).exec());
    const kv = res.kvs[0];
    return kv ? this.entry(kv) : null;
  }

  async txn(compares: readonly KvCompare[], ops: readonly KvOp[]): Promise<TxnResult> {
    const needsLease = ops.some((op) => 'put' in op && op.lease);
    const lease = needsLease ? await this.currentLeaseId() : '0';
    const res = await this.bounded(
      'write the catalog',
      this.client.kv.txn({
        compare: compares.map((c) => ({
          key: Buffer.from(this.prefix + c.key),
          target: 'Mod',
          result: 'Equal',
          mod_revision: String(c.modRevision),
        })),
        success: ops.map((op) =>
          'put' in op
            ? {
                request_put: {
                  key: Buffer.from(this.prefix + op.put),
                  value: Buffer.from(op.value),
                  lease: op.lease ? lease : '0',
                },
              }
            : { request_delete_range: { key: Buffer.from(this.prefix + op.delete) } },
        ),
        failure: [],
      }),
    );
    return { succeeded: res.succeeded, revision: Number(res.header.revision) };
  }

  watch(prefix: string, afterRevision: number, handlers: WatchHandlers): () => void {
    let watcher: Watcher | null = null;
    let stopped = false;
    void this.client
      .watch()
      .prefix(this.prefix + prefix)
      .startRevision(String(afterRevision + 1))
      .create()
      .then((w) => {
        if (stopped) {
          void w.cancel();
          return;
        }
        watcher = w;
        w.on('put', (kv) => handlers.event({ type: 'put', ...this.entry(kv) }));
        w.on('delete', (kv) =>
          handlers.event({
            type: 'delete',
            key: this.unprefix(kv.key),
            value: '',
            modRevision: Number(kv.mod_revision),
          }),
        );
        w.on('disconnected', () => handlers.connection(false));
        w.on('connected', () => handlers.connection(true));
        // A revision compacted away, or a watch the server ended: start over from a read.
        w.on('error', () => {
          if (!stopped) handlers.reset();
        });
      })
      .catch(() => {
        if (!stopped) handlers.reset();
      });
    return () => {
      stopped = true;
      if (watcher) void watcher.cancel().catch(() => undefined);
    };
  }

  async grantLease(ttlS: number, onLost: (why: string) => void): Promise<void> {
    const lease = this.client.lease(ttlS);
    let lost = false;
    lease.on('lost', (err) => {
      if (lost || this.lease !== lease) return;
      lost = true;
      this.lease = null;
      this.leaseId = null;
      onLost(err?.message ?? 'lost');
    });
    try {
      this.leaseId = await this.bounded('grant the lease', lease.grant());
      this.lease = lease;
    } catch (err) {
      lease.release();
      throw err;
    }
  }

  async revokeLease(): Promise<void> {
    const lease = this.lease;
    this.lease = null;
    this.leaseId = null;
    if (lease) await this.bounded('revoke the lease', lease.revoke()).catch(() => lease.release());
  }

  async close(): Promise<void> {
    this.lease?.release();
    this.client.close();
  }

  private async currentLeaseId(): Promise<string> {
    if (!this.leaseId) throw new Error('this node holds no lease (etcd was unreachable)');
    return this.leaseId;
  }

  private entry(kv: IKeyValue): KvEntry {
    return {
      key: this.unprefix(kv.key),
      value: kv.value.toString('utf8'),
      modRevision: Number(kv.mod_revision),
    };
  }

  private unprefix(key: Buffer): string {
    return key.toString('utf8').slice(this.prefix.length);
  }

  /** `p`, or an error naming `what` once `callTimeoutMs` has passed. */
  private bounded<T>(what: string, p: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`could not ${what}: no answer from etcd in ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
    });
    return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
  }
}
