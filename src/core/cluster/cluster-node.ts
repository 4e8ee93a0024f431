/**
 * This hostd as a node of a cluster (docs/operations.md, Cluster mode): it holds a lease in etcd
 * and registers itself on it, keeps the catalog entries of the sandboxes and snapshots it holds
 * equal to what it holds (through the journal: every record the registry writes is also the
 * entry's wanted state), follows the rest of the catalog, and answers where a request for a
 * sandbox or snapshot it does not hold must go.
 *
 * A node that comes back after a crash re-adopts its VMs as a single hostd does, then re-registers
 * each: an entry still its own is taken over as it is; one that is gone (deleted through another
 * node while this one was down) or another node's (handed over) is fenced: the local copy is
 * destroyed. With etcd unreachable, sandboxes it holds keep serving; writes wait and are made when
 * etcd is back; what needs the catalog now (a create, a lookup of an unknown id) gets 503.
 */
import type { Logger } from 'pino';
import { fail, HostdError, show } from '../../errors.js';
import { isSandboxId, isSnapshotId } from '../ids.js';
import type { SandboxInfo } from '../sandbox.js';
import type { RecordStore, SandboxRecord, SnapshotRecord } from '../journal.js';
import { CatalogView, type Versioned } from './catalog-view.js';
import { CatalogWriter } from './catalog-writer.js';
import type { ClusterKv } from './kv.js';
import { sharedSecret, sharedSecretKey } from './shared-secret.js';
import { placementOrder } from './placement.js';
import {
  KEYS,
  parseValue,
  snapshotHolders,
  withoutHolder,
  type DrainReport,
  type NodeRecord,
  type NodeState,
  type SandboxEntry,
  type SnapshotEntry,
} from './records.js';

export interface ClusterNodeOptions {
  readonly id: string;
  /** Where peers and the proxy reach this node's API (SERVICE_NODE_URL); settable until start. */
  readonly url: string;
  readonly version: string;
  /** Lease TTL (SERVICE_CLUSTER_TTL_S): how soon a dead node's sandboxes are known lost. */
  readonly ttlS: number;
  readonly log: Logger;
  /** Where this node's E2B-compatible front listens, if it has one. */
  readonly e2bUrl?: string;
}

/** What the node asks of the sandbox manager (wired by main). */
export interface LocalSandboxes {
  /** True when this node holds sandbox `id` (running, paused or lost). */
  holds(id: string): boolean;
  holdsSnapshot(id: string): boolean;
  /** The snapshots this node holds (its own, and copies of other nodes'). */
  snapshotIds(): string[];
  /** Destroys the local copy of `id`: the catalog says it is gone or another node's. */
  fence(id: string, why: string): Promise<void>;
  fenceSnapshot(id: string, why: string): void;
  capacity(): { sandboxes: number; memory_mib: number };
  load(): { sandboxes: number; memory_free_mib: number };
  templates(): Record<string, { state: string; build: string | null }>;
}

/** Where a request for a sandbox or snapshot goes. */
export type Route = { readonly local: true } | { readonly local: false; readonly node: NodeRecord };

/** A node as `GET /v1/cluster` shows it (docs/api.md, Cluster). */
export interface NodeInfo {
  id: string;
  url: string | null;
  state: NodeState | 'down';
  version: string | null;
  started_at: string | null;
  /** Sandboxes running there now (its live keys); for a down node, those it held. */
  sandboxes: number;
  capacity: NodeRecord['capacity'] | null;
  load: NodeRecord['load'] | null;
  templates: NodeRecord['templates'];
  /** Its last drain since it started (records.ts DrainReport); null when none, or down. */
  drain: DrainReport | null;
}

export interface ClusterInfo {
  enabled: true;
  /** The node that answered. */
  node: string;
  etcd: { connected: boolean; pending_writes: number };
  nodes: NodeInfo[];
}

/** How long a request for a sandbox being handed over waits for the hand-over to end. */
const MOVE_WAIT_MS = 30_000;
/** How long a create waits for its catalog entry before it is refused. */
const CONFIRM_MS = 8_000;
/** How often the node's load is published (and at once on a change of state). */
const PUBLISH_EVERY_MS = 2_000;

export class ClusterNode {
  readonly view: CatalogView;
  readonly writer: CatalogWriter;
  private local: LocalSandboxes | null = null;
  private nodeState: NodeState = 'serving';
  private drainReport: DrainReport | null = null;
  private readonly startedAt = new Date().toISOString();
  /** Ids whose entries this node must not write any more (fenced, handed over). */
  private readonly released = new Set<string>();
  /**
   * Sandboxes and snapshots being taken over from another node: the revision of their entry as
   * handed over (a sandbox's `moving` one), which the first write of their new entry compares
   * with (a hand-over's compare-and-set).
   */
  private readonly takeovers = new Map<string, number>();
  /**
   * Snapshots this node holds a copy of (core/cluster/snapshot-copies.ts) while another node
   * writes their entry: their records are kept here but not mirrored, and this node is in the
   * entry's `copies`.
   */
  private readonly copyIds = new Set<string>();
  /** Fetches a snapshot held elsewhere for a create placed here (bound by main). */
  private copies: { ensure(id: string): Promise<void> } | null = null;
  /** Set once the first registration is done: records written before are re-adoptions. */
  private joined = false;
  private stopped = false;
  /** Set by `leave()`: hostd stops, and the node is `draining` until it is gone. */
  private leaving = false;
  /**
   * This node's record writes, one at a time in the order asked (two in flight at once, a drain's
   * and an undrain's, could land in either order and leave the earlier intent published).
   */
  private publishing: Promise<void> = Promise.resolve();
  /** A publish asked but not yet started: a further one joins it (it reads the record then). */
  private nextPublish: { force: boolean; done: Promise<void> } | null = null;
  /**
   * The revision of this node's record as last written by it (0: not written on this lease).
   * Each write compares with it, so that a write etcd applies late (its answer timed out here)
   * can never land over a newer one: it fails its compare instead.
   */
  private recordRevision = 0;
  private publishTimer: NodeJS.Timeout | null = null;
  private lastPublished = '';
  private connecting: Promise<void> | null = null;
  /** Where peers and the proxy reach this node (known once it listens). */
  url: string;
  /**
   * Where peers reach this node's E2B-compatible front (known once it listens); null: it has
   * none, and E2B requests for its sandboxes cannot be forwarded to it.
   */
  e2bUrl: string | null;

  constructor(
    private readonly kv: ClusterKv,
    readonly options: ClusterNodeOptions,
  ) {
    this.url = options.url;
    this.e2bUrl = options.e2bUrl ?? null;
    this.view = new CatalogView(kv);
    this.view.onSnapshotGone((id) => this.snapshotGone(id));
    this.view.onChange(() => this.checkCopies());
    this.writer = new CatalogWriter(kv, {
      node: options.id,
      onConflict: (kind, id, current) => void this.onConflict(kind, id, current),
      onError: (err, kind, id) =>
        options.log.warn(
          { err: (err as Error).message, [kind]: id },
          'catalog write failed; retrying',
        ),
    });
  }

  get id(): string {
    return this.options.id;
  }

  get state(): NodeState {
    return this.nodeState;
  }

  /** The manager this node reports on; call once, before `start`. */
  bind(local: LocalSandboxes): void {
    this.local = local;
  }

  /** What fetches a snapshot held elsewhere (core/cluster/snapshot-copies.ts). */
  bindCopies(copies: { ensure(id: string): Promise<void> }): void {
    this.copies = copies;
  }

  /**
   * Makes snapshot `id`, held by another node, held here too (a create from it placed here):
   * its files fetched from a node holding them, and this node added to its entry's copies.
   */
  async fetchSnapshot(id: string): Promise<void> {
    if (!this.copies) throw fail('snapshotNotFound', id);
    await this.copies.ensure(id);
  }

  /** Sandbox records, written to `inner` and mirrored into the catalog. */
  sandboxRecords(inner: RecordStore<SandboxRecord>): RecordStore<SandboxRecord> {
    return {
      write: (record) => {
        inner.write(record);
        if (this.released.has(record.id)) return;
        const takeover = this.takeovers.get(record.id);
        this.takeovers.delete(record.id);
        this.writer.setSandbox(
          record.id,
          this.entryOf(record),
          record.state === 'running',
          takeover ?? this.expect(),
        );
      },
      remove: (id) => {
        inner.remove(id);
        if (this.released.delete(id)) return;
        this.writer.setSandbox(id, null, false, 'adopt');
      },
      flush: () => inner.flush(),
      readAll: (onBad) => inner.readAll(onBad),
    };
  }

  /**
   * Snapshot records, written to `inner` and mirrored into the catalog once durable (`flush`,
   * which Snapshots awaits after each write): a record whose sync fails is removed without the
   * catalog ever naming it here. Written at once, a taken-over snapshot's entry became this
   * node's, so the source let its copy go, and the removal then deleted the entry: the snapshot
   * was lost on both nodes.
   */
  snapshotRecords(inner: RecordStore<SnapshotRecord>): RecordStore<SnapshotRecord> {
    /** Written, not yet durable nor in the catalog. */
    const unsynced = new Map<string, SnapshotRecord>();
    return {
      write: (record) => {
        inner.write(record);
        unsynced.set(record.id, record);
      },
      flush: async () => {
        const written = [...unsynced.values()];
        await inner.flush();
        for (const record of written) {
          if (unsynced.get(record.id) !== record) continue;
          unsynced.delete(record.id);
          this.mirrorSnapshot(record);
        }
      },
      remove: (id) => {
        inner.remove(id);
        if (unsynced.delete(id) && !this.copyIds.has(id)) {
          // Never in the catalog as this node's: nothing to remove there (a take-over's entry
          // stays its source's).
          this.takeovers.delete(id);
          return;
        }
        if (this.released.delete(id)) return;
        if (this.copyIds.delete(id)) {
          // Only this copy goes: the snapshot stays, on its node and the other copies.
          void this.leaveCopies(id).catch((err: unknown) =>
            this.options.log.warn({ snapshot: id, err }, 'could not leave the copies'),
          );
          return;
        }
        this.writer.setSnapshot(id, null, 'adopt');
      },
      readAll: (onBad) => inner.readAll(onBad),
    };
  }

  /** The catalog entry of snapshot record `record`, durable here now. */
  private mirrorSnapshot(record: SnapshotRecord): void {
    if (this.released.has(record.id) || this.copyIds.has(record.id)) return;
    const entry: SnapshotEntry = {
      node: this.id,
      name: record.name ?? null,
      template: record.template,
      source_sandbox_id: record.source_sandbox_id,
      size_bytes: record.size_bytes,
      created_at: record.created_at,
    };
    const takeover = this.takeovers.get(record.id);
    this.takeovers.delete(record.id);
    this.writer.setSnapshot(record.id, entry, takeover ?? this.expect());
  }

  /**
   * Joins the cluster: a lease, this node's record on it, the catalog read and watched, and every
   * entry of what it holds written (re-adopted or fenced). When etcd cannot be reached it goes on
   * trying in the background, and resolves after the first attempt either way.
   */
  async start(): Promise<void> {
    this.connecting ??= this.connectLoop();
    await Promise.race([this.connecting, new Promise((r) => setTimeout(r, 10_000).unref())]);
    this.publishTimer = setInterval(() => void this.publish(false), PUBLISH_EVERY_MS);
    this.publishTimer.unref();
  }

  /** Leaves the cluster: its record and live keys go at once (its lease is revoked). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.publishTimer) clearInterval(this.publishTimer);
    // A last chance for writes made during shutdown (paused sandboxes): bounded, never blocking.
    await this.writer
      .settle(3000)
      .catch((err: HostdError) =>
        this.options.log.warn({ why: err.message }, 'some catalog writes wait for the next start'),
      );
    this.writer.stop();
    this.view.stop();
    await this.kv.revokeLease().catch(() => undefined);
    await this.kv.close();
  }

  /**
   * Sets whether this node takes creates, and publishes it now. Once `leave()` was called (hostd
   * stops) it stays `draining`/`drained`: `serving` is refused with `409 cluster_conflict`.
   */
  async setState(state: NodeState): Promise<void> {
    if (state === 'serving' && this.leaving) throw fail('nodeStopping', this.id);
    this.nodeState = state;
    await this.publish(true);
  }

  /** Whether hostd is stopping (SIGTERM or SIGINT): the node takes creates no more. */
  get isLeaving(): boolean {
    return this.leaving;
  }

  /**
   * hostd stops (SIGTERM, SIGINT): the node is `draining` from now until its record goes with
   * its lease, so that no node places a create on it (the manager refuses them from its
   * shutdown on), and an undrain is refused rather than publishing `serving` for a node about
   * to go. Published now; rejects when etcd cannot be reached (the record goes with the lease).
   */
  async leave(): Promise<void> {
    this.leaving = true;
    if (this.nodeState === 'serving') this.nodeState = 'draining';
    await this.publish(true);
  }

  /**
   * Sets what this node's drain did so far, shown at once by this node's `GET /v1/cluster` and
   * by the others' with the next publish (within PUBLISH_EVERY_MS; `setState` publishes now).
   */
  reportDrain(report: DrainReport): void {
    this.drainReport = report;
  }

  /** Resolves once these new sandboxes' entries are in the catalog; 503 when they cannot be. */
  confirmSandboxes(ids: readonly string[]): Promise<void> {
    return this.writer.confirm(
      ids.map((id) => ({ kind: 'sandbox' as const, id })),
      CONFIRM_MS,
    );
  }

  confirmSnapshot(id: string): Promise<void> {
    return this.writer.confirm([{ kind: 'snapshot', id }], CONFIRM_MS);
  }

  /**
   * Resolves once this node is connected to etcd, or after `timeoutMs` either way (then
   * `ensureConnected` answers). One etcd member going down drops the watch on it until the
   * client moves to another member: a create asked meanwhile waits for that instead of failing.
   */
  async awaitConnected(timeoutMs: number): Promise<void> {
    await this.view.waitFor(
      () => (this.view.ready && this.view.connected ? true : null),
      timeoutMs,
    );
  }

  /** 503 cluster_unavailable unless etcd is reachable now (what a create needs). */
  ensureConnected(): void {
    if (!this.view.ready || !this.view.connected) {
      throw fail('clusterUnavailable', 'this node is not connected to etcd');
    }
  }

  /**
   * Where a request for sandbox `id` goes: here (this node holds it, or nobody does and this
   * node answers 404), or to the node that holds it. Throws 410 for a sandbox lost with its node,
   * 503 for one paused on a node that is down, or being moved for longer than a request waits.
   */
  async locateSandbox(id: string, signal?: AbortSignal): Promise<Route> {
    if (!isSandboxId(id) || this.local?.holds(id)) return { local: true };
    let found = await this.lookup(id);
    if (found?.value.state === 'moving') {
      const to = found.value.to ?? '?';
      found = await this.view
        .waitFor(
          () => {
            const e = this.view.sandboxes.get(id);
            return !e || e.value.state !== 'moving' ? { e } : null;
          },
          MOVE_WAIT_MS,
          signal,
        )
        .then((r) => {
          if (r === null) throw fail('sandboxMoving', `sandbox ${id}`, to);
          return r.e ? { ...r.e, liveOn: this.view.live.get(id) ?? null } : null;
        });
      if (this.local?.holds(id)) return { local: true };
    }
    if (!found || found.value.node === this.id) return { local: true };
    const { value: entry } = found;
    const node = this.view.nodes.get(entry.node);
    if (entry.state === 'lost') {
      // Its node answers (and deletes it) while it is up.
      if (node) return { local: false, node };
      throw fail('sandboxLostOnNode', id, entry.node, entry.error ?? 'its VM is gone');
    }
    if (entry.state === 'running') {
      if (found.liveOn === null) throw fail('sandboxLostWithNode', id, entry.node);
      if (!node) throw fail('nodeUnavailable', `sandbox ${id}`, entry.node);
      return { local: false, node };
    }
    if (!node) throw fail('nodeUnavailable', `sandbox ${id}`, entry.node);
    return { local: false, node };
  }

  /**
   * `DELETE` of a sandbox whose node is gone (lost with it) or down (paused there): its catalog
   * entry is removed by compare-and-set, so the id is unknown everywhere at once. The node, if
   * it comes back, finds the entry gone and destroys its copy (fencing). False when the entry
   * changed meanwhile (the node came back: the caller routes the delete again).
   */
  async forgetStranded(id: string): Promise<boolean> {
    let found;
    try {
      found = await this.view.lookup(id, true);
    } catch {
      throw fail('clusterUnavailable', `cannot delete sandbox ${id}`);
    }
    if (!found) return true;
    if (this.view.nodes.has(found.value.node)) return false;
    let res;
    try {
      res = await this.kv.txn(
        [{ key: KEYS.sandbox(id), modRevision: found.modRevision }],
        [{ delete: KEYS.sandbox(id) }, { delete: KEYS.live(id) }],
      );
    } catch {
      throw fail('clusterUnavailable', `cannot delete sandbox ${id}`);
    }
    if (res.succeeded) {
      // Gone for this node's requests at once, not when the watch brings the delete.
      this.view.sandboxes.delete(id);
      this.view.live.delete(id);
    }
    return res.succeeded;
  }

  /**
   * The sandboxes of nodes that are down, as lists show them (the nodes that are up list their
   * own): one lost with its node is `failed` (its id answers 410), one paused there `paused`.
   */
  strandedSandboxes(): SandboxInfo[] {
    const out: SandboxInfo[] = [];
    for (const [id, { value: e }] of this.view.sandboxes) {
      if (e.node === this.id || this.view.nodes.has(e.node)) continue;
      const paused = e.state === 'paused';
      out.push({
        id,
        state: paused ? 'paused' : 'failed',
        template: e.template,
        created_at: e.created_at,
        last_used_at: e.created_at,
        parent_id: e.parent,
        snapshot_id: e.snapshot,
        busy: false,
        queued: 0,
        error: paused
          ? null
          : e.state === 'lost'
            ? (e.error ?? 'its VM is gone')
            : `lost with node ${e.node}, which stopped answering`,
        network: { allow_out: [], bytes_out: 0, bytes_in: 0 },
        memory_mib: null,
        merged_from: [],
        metadata: {},
        timeout: null,
        on_timeout: null,
        expires_at: null,
        paused_by: null,
        node: e.node,
      });
    }
    return out;
  }

  /**
   * Where a request for snapshot `id` goes: here when this node holds it (its own or a copy),
   * else its node, else a live node holding a copy; here too when nobody holds it (404). A
   * snapshot whose every holder is down is 503 node_unavailable, naming its node.
   *
   * A delete (`isDelete`) goes to the snapshot's node, which deletes its entry (the copies then
   * drop theirs). When that node is down, the entry is removed here by compare-and-set and the
   * answer is `deleted`: its node, back, finds the entry gone and drops its files (fencing).
   */
  async locateSnapshot(id: string, isDelete = false): Promise<Route | 'deleted'> {
    if (!isSnapshotId(id)) return { local: true };
    if (!isDelete && this.local?.holdsSnapshot(id)) return { local: true };
    const found = await this.snapshotEntry(id);
    if (!found || found.value.node === this.id) return { local: true };
    const e = found.value;
    if (isDelete) return this.deleteRoute(id);
    for (const holder of snapshotHolders(e)) {
      const node = this.view.nodes.get(holder);
      if (node && holder !== this.id) return { local: false, node };
    }
    throw fail('nodeUnavailable', `snapshot ${id}`, e.node);
  }

  /** Snapshot `id`'s entry, from this copy of the catalog or the store (503 when unreachable). */
  async snapshotEntry(id: string): Promise<Versioned<SnapshotEntry> | null> {
    try {
      return await this.view.snapshot(id);
    } catch {
      throw fail('clusterUnavailable', `cannot look up snapshot ${id}`);
    }
  }

  /**
   * The live nodes holding snapshot `e`'s files, other than this one, to fetch them from: its
   * node first, then its copies.
   */
  snapshotSources(e: SnapshotEntry): NodeRecord[] {
    return snapshotHolders(e)
      .filter((n) => n !== this.id)
      .map((n) => this.view.nodes.get(n))
      .filter((n): n is NodeRecord => n !== undefined);
  }

  /**
   * Where a delete of snapshot `id` goes: its node when it is alive; when it is down, the entry
   * is removed here by compare-and-set on what the store holds now (`deleted`).
   */
  private async deleteRoute(id: string): Promise<Route | 'deleted'> {
    const key = KEYS.snapshot(id);
    try {
      for (;;) {
        const current = await this.kv.get(key);
        const e = current ? parseValue<SnapshotEntry>(current.value) : null;
        if (!current || !e) return { local: true }; // gone meanwhile: 404 here
        if (e.node === this.id) return { local: true };
        const node = this.view.nodes.get(e.node);
        if (node) return { local: false, node };
        const res = await this.kv.txn(
          [{ key, modRevision: current.modRevision }],
          [{ delete: key }],
        );
        if (res.succeeded) {
          this.view.snapshots.delete(id);
          this.snapshotGone(id);
          return 'deleted';
        }
      }
    } catch {
      throw fail('clusterUnavailable', `cannot delete snapshot ${id}`);
    }
  }

  /**
   * Before a copy of another node's snapshot `id` is registered here (its files fetched): its
   * record is kept here without being written as this node's entry.
   */
  expectCopy(id: string): void {
    this.released.delete(id);
    this.copyIds.add(id);
  }

  /** The copy of `id` was not registered after all (its fetch failed). */
  cancelCopy(id: string): void {
    this.copyIds.delete(id);
  }

  /**
   * Adds this node to snapshot `id`'s copies (compare-and-set, again on a race with another
   * node's change). 404 snapshot_not_found when the entry is gone (deleted meanwhile).
   */
  async joinCopies(id: string): Promise<void> {
    const done = await this.editSnapshot(id, (e) =>
      snapshotHolders(e).includes(this.id)
        ? null
        : { ...e, copies: [...(e.copies ?? []), this.id] },
    );
    if (done === 'gone') throw fail('snapshotNotFound', id);
  }

  /** Removes this node from snapshot `id`'s copies (its copy here is gone). */
  private async leaveCopies(id: string): Promise<void> {
    await this.editSnapshot(id, (e) =>
      e.node === this.id || !(e.copies ?? []).includes(this.id)
        ? null
        : { ...e, copies: (e.copies ?? []).filter((n) => n !== this.id) },
    );
  }

  /**
   * A drain, for snapshot `id` this node holds: when another live node holds its files too, this
   * node leaves its entry (the entry becomes one of those nodes', when it was this node's) and
   * true is returned: the local copy can go with nothing handed over. False when no live node
   * has it (it must be handed over).
   */
  async leaveToCopies(id: string): Promise<boolean> {
    const live = (n: string): boolean => this.view.nodes.has(n);
    const done = await this.editSnapshot(id, (e) =>
      snapshotHolders(e).some((n) => n !== this.id && live(n))
        ? withoutHolder(e, this.id, live)
        : null,
    );
    if (done === 'same') return false;
    this.copyIds.delete(id);
    this.release('snapshot', id);
    return true;
  }

  /**
   * Changes snapshot `id`'s entry by compare-and-set on what was read, again when another node
   * changed it meanwhile. `change` answers the new entry, or null for no change. 503 when the
   * store cannot be reached.
   */
  private async editSnapshot(
    id: string,
    change: (e: SnapshotEntry) => SnapshotEntry | null,
  ): Promise<'done' | 'same' | 'gone'> {
    const key = KEYS.snapshot(id);
    try {
      for (;;) {
        const current = await this.kv.get(key);
        const entry = current ? parseValue<SnapshotEntry>(current.value) : null;
        if (!current || !entry) return 'gone';
        const next = change(entry);
        if (next === null) return 'same';
        const res = await this.kv.txn(
          [{ key, modRevision: current.modRevision }],
          [{ put: key, value: JSON.stringify(next) }],
        );
        if (res.succeeded) return 'done';
      }
    } catch (err) {
      if (err instanceof HostdError) throw err;
      throw fail('clusterUnavailable', `cannot change the entry of snapshot ${id}`);
    }
  }

  /**
   * A snapshot entry deleted (through any node, or while this one was away): the files this node
   * holds of it go, unless it is this node's own delete (nothing left here then).
   */
  private snapshotGone(id: string): void {
    if (!this.local?.holdsSnapshot(id) || this.writer.pending('snapshot', id)) return;
    if (this.takeovers.has(id)) return;
    const why = 'it was deleted through another node';
    this.options.log.warn({ snapshot: id, why }, 'dropping the local copy');
    this.copyIds.delete(id);
    this.release('snapshot', id);
    this.local.fenceSnapshot(id, why);
  }

  /** Copies that became this node's own (their node drained and gave the entry to this one). */
  private checkCopies(): void {
    for (const id of this.copyIds) {
      if (this.view.snapshots.get(id)?.value.node === this.id) this.copyIds.delete(id);
    }
  }

  /** True when this node holds sandbox `id`. */
  holds(id: string): boolean {
    return this.local?.holds(id) ?? false;
  }

  /** A node by id, if it is alive. */
  liveNode(id: string): NodeRecord | undefined {
    return this.view.nodes.get(id);
  }

  /** Every live node but this one (list routes ask each). */
  otherNodes(): NodeRecord[] {
    return [...this.view.nodes.values()].filter((n) => n.id !== this.id);
  }

  /**
   * The nodes to ask for a create, in order (core/cluster/placement.ts). A create from a snapshot
   * is placed like any create of its template, the nodes holding its files first (the least
   * loaded of them first: no fetch there), then the others, which fetch its files from a holder
   * (core/cluster/snapshot-copies.ts): so a full or draining holder passes the create on. A
   * snapshot the catalog does not know is this node's to answer (404); one whose every holder
   * is down is 503 node_unavailable (nobody can fetch it).
   *
   * A template no node can take now: empty when a live node serves it (all full, draining, or
   * its build not ready: the front answers 503 insufficient_resources); 503 node_unavailable
   * when only a node that is down served it (a sandbox or snapshot of it is there); else 404
   * template_not_found naming what the live nodes serve, as a single hostd names its own.
   */
  async placeCreate(req: { template?: string; snapshot?: string }): Promise<NodeRecord[]> {
    this.ensureConnected();
    const nodes = [...this.view.nodes.values()].map((n) =>
      n.id === this.id ? this.selfRecord() : n,
    );
    if (!nodes.some((n) => n.id === this.id)) nodes.push(this.selfRecord());
    const byId = new Map(nodes.map((n) => [n.id, n]));
    if (req.snapshot !== undefined) {
      const found = isSnapshotId(req.snapshot) ? await this.snapshotEntry(req.snapshot) : null;
      if (!found) return [this.selfRecord()];
      return this.placeFromSnapshot(req.snapshot, found.value, nodes).map((id) => byId.get(id)!);
    }
    const name = req.template ?? Object.keys(this.selfRecord().templates)[0] ?? '';
    const order = this.placementOf(nodes, name);
    if (order.length === 0) this.checkTemplateKnown(name, nodes);
    return order.map((id) => byId.get(id)!);
  }

  private placementOf(nodes: readonly NodeRecord[], template: string, sample?: number): string[] {
    return placementOrder(
      {
        nodes,
        running: (id) => this.view.liveCount(id),
        lowMemoryMib: 512,
        ...(sample !== undefined ? { sample } : {}),
      },
      { template, self: this.id },
    );
  }

  /**
   * A create from snapshot `id` (entry `e`): the live nodes holding its files, least loaded
   * first, then the nodes of the same template build as a holder (a state restores only onto
   * its build), then the rest, each group placed as any create.
   */
  private placeFromSnapshot(id: string, e: SnapshotEntry, nodes: readonly NodeRecord[]): string[] {
    const live = new Set(nodes.map((n) => n.id));
    const holders = new Set(snapshotHolders(e).filter((n) => live.has(n)));
    if (holders.size === 0) throw fail('nodeUnavailable', `snapshot ${id}`, e.node);
    const builds = new Set(
      nodes.filter((n) => holders.has(n.id)).map((n) => n.templates[e.template]?.build ?? null),
    );
    const held = nodes.filter((n) => holders.has(n.id));
    const sameBuild = nodes.filter(
      (n) => !holders.has(n.id) && builds.has(n.templates[e.template]?.build ?? null),
    );
    const rest = nodes.filter((n) => !holders.has(n.id) && !sameBuild.includes(n));
    const order = [
      ...this.placementOf(held, e.template, held.length),
      ...this.placementOf(sameBuild, e.template),
      ...this.placementOf(rest, e.template),
    ];
    if (order.length === 0) {
      this.checkTemplateKnown(e.template, nodes);
      throw fail('noNodeAvailable', e.template);
    }
    return order;
  }

  /**
   * Throws for a template that no live node of `nodes` serves (placeCreate): node_unavailable
   * naming a node that is down whose sandboxes or snapshots are of it, else template_not_found.
   * Nodes that are down are known by their entries only (their records went with their lease).
   */
  private checkTemplateKnown(name: string, nodes: readonly NodeRecord[]): void {
    if (nodes.some((n) => n.templates[name] !== undefined)) return;
    const live = new Set(nodes.map((n) => n.id));
    const down = [...this.view.sandboxes.values(), ...this.view.snapshots.values()]
      .map((e) => e.value)
      .filter((e) => e.template === name && !live.has(e.node))
      .map((e) => e.node)
      .sort()[0];
    if (down !== undefined) throw fail('nodeUnavailable', `template ${show(name)}`, down);
    throw fail('templateNotFound', name, this.templateNames());
  }

  /**
   * The templates the live nodes serve (in any state), this node's own first in its order, then
   * the others' as their records list them: with the same templates on every node (as
   * docs/cluster.md asks), what a single hostd lists. E2B's aliases map onto these.
   */
  templateNames(): string[] {
    const known = new Set(Object.keys(this.selfRecord().templates));
    const others = [...this.view.nodes.values()]
      .filter((n) => n.id !== this.id)
      .sort((a, b) => a.id.localeCompare(b.id));
    for (const n of others) for (const t of Object.keys(n.templates)) known.add(t);
    return [...known];
  }

  /**
   * The newest snapshot named `name` in the catalog, on any node (E2B's creates name snapshots;
   * a single hostd's `snapshotByName` answers the same for its own). Newest by `created_at`,
   * then the greater id: every node picks the same one. Null when none is named so.
   */
  snapshotByName(name: string): NamedSnapshot | null {
    const entries = [...this.view.snapshots].map(([id, v]) => [id, v.value] as const);
    return newestNamed(entries, name);
  }

  /**
   * The newest snapshot of the first of `names` that has one, read from the store, not this
   * node's copy: asked when the copy knows none of them, since the snapshot may have been taken
   * through another node a moment ago, and confirmed there once the store had it, before this
   * node's watch brought it. One read of the store serves every name. Null when the store knows
   * none either, or cannot be reached (the name then reads as a template's, as on a single hostd).
   */
  async snapshotByNameInStore(names: readonly string[]): Promise<NamedSnapshot | null> {
    let fresh;
    try {
      fresh = [...(await this.view.snapshotsFresh())];
    } catch {
      return null; // the store is unreachable: what this copy knows is all there is
    }
    for (const name of names) {
      const found = newestNamed(fresh, name);
      if (found) return found;
    }
    return null;
  }

  /** `GET /v1/cluster`: the live nodes, and nodes that are down but still named by sandboxes. */
  info(): ClusterInfo {
    const nodes: NodeInfo[] = [];
    const live = new Map(this.view.nodes);
    live.set(this.id, this.selfRecord());
    for (const n of [...live.values()].sort((a, b) => a.id.localeCompare(b.id))) {
      nodes.push({
        id: n.id,
        url: n.url,
        state: n.state,
        version: n.version,
        started_at: n.started_at,
        sandboxes: this.view.liveCount(n.id),
        capacity: n.capacity,
        load: n.load,
        templates: n.templates,
        drain: n.drain ?? null,
      });
    }
    const stranded = new Map<string, number>();
    for (const [, e] of this.view.sandboxes) {
      if (!live.has(e.value.node))
        stranded.set(e.value.node, (stranded.get(e.value.node) ?? 0) + 1);
    }
    for (const [id, count] of [...stranded].sort()) {
      nodes.push({
        id,
        url: null,
        state: 'down',
        version: null,
        started_at: null,
        sandboxes: count,
        capacity: null,
        load: null,
        templates: {},
        drain: null,
      });
    }
    return {
      enabled: true,
      node: this.id,
      etcd: {
        connected: this.view.ready && this.view.connected,
        pending_writes: this.writer.backlog,
      },
      nodes,
    };
  }

  /**
   * A hand-over's first step, on the source: once its `paused` entry is written, the entry goes
   * `moving` to node `to` by compare-and-set (its live key goes), and this node stops writing it.
   * Returns the revision of the `moving` entry, which `abortMove` and the target compare with.
   */
  async beginMove(id: string, to: string): Promise<number> {
    this.ensureConnected();
    await this.confirmSandboxes([id]);
    const key = KEYS.sandbox(id);
    let rev: number;
    try {
      const current = await this.kv.get(key);
      const entry = current ? parseValue<SandboxEntry>(current.value) : null;
      if (!current || !entry || entry.node !== this.id || entry.state !== 'paused') {
        throw fail('clusterConflict', id);
      }
      const moving: SandboxEntry = { ...entry, state: 'moving', to };
      const res = await this.kv.txn(
        [{ key, modRevision: current.modRevision }],
        [{ put: key, value: JSON.stringify(moving) }, { delete: KEYS.live(id) }],
      );
      if (!res.succeeded) throw fail('clusterConflict', id);
      rev = res.revision;
    } catch (err) {
      if (err instanceof HostdError) throw err;
      throw fail('clusterUnavailable', `cannot move sandbox ${id}`);
    }
    this.release('sandbox', id);
    return rev;
  }

  /**
   * The hand-over did not happen: the entry goes back from `moving` to this node's `paused`
   * (compare-and-set on the `moving` revision), and this node writes it again. False when the
   * entry changed meanwhile (the target took it after all: the caller must not keep its copy).
   */
  async abortMove(id: string, rev: number): Promise<boolean> {
    const key = KEYS.sandbox(id);
    const current = await this.kv.get(key);
    const entry = current ? parseValue<SandboxEntry>(current.value) : null;
    if (!current || !entry || current.modRevision !== rev) return false;
    const back: SandboxEntry = { ...entry, node: this.id, state: 'paused' };
    delete (back as { to?: string }).to;
    const res = await this.kv.txn(
      [{ key, modRevision: rev }],
      [{ put: key, value: JSON.stringify(back) }],
    );
    if (!res.succeeded) return false;
    this.released.delete(id);
    this.writer.setSandbox(id, back, false, res.revision);
    return true;
  }

  /**
   * A hand-over's target side, before the sandbox is registered here: its entry must be moving
   * from `from` to this node; the registration's first write then takes it over by
   * compare-and-set on that entry's revision.
   */
  async expectTakeover(id: string, from: string): Promise<void> {
    this.ensureConnected();
    let current;
    try {
      current = await this.kv.get(KEYS.sandbox(id));
    } catch {
      throw fail('clusterUnavailable', `cannot take over sandbox ${id}`);
    }
    const entry = current ? parseValue<SandboxEntry>(current.value) : null;
    if (
      !current ||
      !entry ||
      entry.state !== 'moving' ||
      entry.node !== from ||
      entry.to !== this.id
    ) {
      throw fail('clusterConflict', id);
    }
    this.released.delete(id);
    this.takeovers.set(id, current.modRevision);
  }

  /**
   * A snapshot's hand-over, the source's side: its entry, written and still this node's, at the
   * revision the target's first write compares with. Unlike a sandbox's, the entry does not go
   * `moving`: the snapshot never changes, and serves here until the target has it. A delete
   * through this node meanwhile is refused (503 sandbox_moving); one made through another node
   * (the entry gone) makes the target's compare-and-set fail, and the target drops its copy.
   */
  async beginSnapshotMove(id: string): Promise<number> {
    this.ensureConnected();
    await this.confirmSnapshot(id);
    let current;
    try {
      current = await this.kv.get(KEYS.snapshot(id));
    } catch {
      throw fail('clusterUnavailable', `cannot move snapshot ${id}`);
    }
    const entry = current ? parseValue<SnapshotEntry>(current.value) : null;
    if (!current || !entry || entry.node !== this.id) throw fail('clusterConflict', id);
    return current.modRevision;
  }

  /**
   * After a snapshot's offer failed: whether the target wrote the entry after all (its answer
   * was lost), in which case the snapshot is its and this node must let it go. False when the
   * store cannot say (the snapshot then stays here; the writer fences it if it was taken).
   */
  async snapshotTakenBy(id: string, to: string): Promise<boolean> {
    try {
      const current = await this.kv.get(KEYS.snapshot(id));
      const entry = current ? parseValue<SnapshotEntry>(current.value) : null;
      return entry?.node === to;
    } catch {
      return false;
    }
  }

  /**
   * A snapshot's hand-over, the target's side, before it is registered here: its entry must
   * still be `from`'s at revision `rev`; the registration's first write then takes it over by
   * compare-and-set on that revision.
   */
  async expectSnapshotTakeover(id: string, from: string, rev: number): Promise<void> {
    this.ensureConnected();
    let current;
    try {
      current = await this.kv.get(KEYS.snapshot(id));
    } catch {
      throw fail('clusterUnavailable', `cannot take over snapshot ${id}`);
    }
    const entry = current ? parseValue<SnapshotEntry>(current.value) : null;
    if (!current || !entry || entry.node !== from || current.modRevision !== rev) {
      throw fail('clusterConflict', id);
    }
    this.released.delete(id);
    this.takeovers.set(id, rev);
  }

  /**
   * Where this node's snapshot `id` goes when it drains: the nodes `moveTargets` gives, those
   * that hold the most sandboxes made from it first (they have its frozen state already, brought
   * by those sandboxes' hand-overs, so nothing but its record is copied).
   */
  snapshotTargets(
    id: string,
    template: string,
    sent: ReadonlyMap<string, string> = new Map(),
  ): NodeRecord[] {
    const users = new Map<string, number>();
    for (const [sid, e] of this.view.sandboxes) {
      if (e.value.snapshot !== id) continue;
      const node = sent.get(sid) ?? e.value.node;
      users.set(node, (users.get(node) ?? 0) + 1);
    }
    const order = this.moveTargets(template, sent);
    // A stable sort: among nodes with as many users, the least loaded first, as before.
    return order
      .map((n, i) => ({ n, i, u: users.get(n.id) ?? 0 }))
      .sort((a, b) => b.u - a.u || a.i - b.i)
      .map((x) => x.n);
  }

  /**
   * Forgets node `id`, down for good (`DELETE /v1/cluster/nodes/{id}`): the catalog entries of
   * the sandboxes and snapshots it held are removed, each by compare-and-set on what was read,
   * so that they answer 404 everywhere instead of 503 node_unavailable or 410 sandbox_lost. Its
   * files stay on its host; should it come back, it finds its entries gone and destroys its
   * copies (fencing), as after any delete made while it was away. A node that holds its lease
   * is refused (409): drain it instead. 404 when the catalog names no such node.
   */
  async forgetNode(id: string): Promise<{ sandboxes: number; snapshots: number }> {
    this.ensureConnected();
    if (id === this.id || this.view.nodes.has(id)) throw fail('nodeAlive', id);
    const removed = { sandboxes: 0, snapshots: 0 };
    let copies = 0;
    try {
      for (const kind of ['sandboxes', 'snapshots'] as const) {
        const prefix = kind === 'sandboxes' ? KEYS.sandbox('') : KEYS.snapshot('');
        for (const e of (await this.kv.list(prefix)).entries) {
          const entry = parseValue<SandboxEntry | SnapshotEntry>(e.value);
          if (
            kind === 'snapshots' &&
            entry &&
            snapshotHolders(entry as SnapshotEntry).includes(id)
          ) {
            // A snapshot with a copy on a live node stays, that node's; the node's copy is let go.
            const next = withoutHolder(entry as SnapshotEntry, id, (n) => this.view.nodes.has(n));
            if (next) {
              const res = await this.kv.txn(
                [{ key: e.key, modRevision: e.modRevision }],
                [{ put: e.key, value: JSON.stringify(next) }],
              );
              if (res.succeeded) copies++;
              continue;
            }
          }
          if (entry?.node !== id) continue;
          const res = await this.kv.txn(
            [{ key: e.key, modRevision: e.modRevision }],
            [{ delete: e.key }],
          );
          // One that changed meanwhile (its node back, a hand-over) is no longer the node's.
          if (res.succeeded) removed[kind]++;
        }
      }
    } catch (err) {
      if (err instanceof HostdError) throw err;
      throw fail('clusterUnavailable', `cannot forget node ${id}`);
    }
    if (removed.sandboxes + removed.snapshots + copies === 0) throw fail('nodeNotFound', id);
    this.options.log.warn(
      { node: id, ...removed, copies },
      'node forgotten: its catalog entries removed',
    );
    return removed;
  }

  /** The take-over of `id` did not happen (its files could not be fetched). */
  cancelTakeover(id: string): void {
    this.takeovers.delete(id);
  }

  /**
   * Where this node's sandboxes of `template` go when it drains: the other `serving` nodes with
   * the template ready, least loaded first. Load counts every sandbox a node holds, paused ones
   * too (a drain's hand-overs arrive paused), and `sent` (sandbox id -> node: hand-overs under
   * way or just made, which this node's copy of the catalog may not show yet).
   */
  moveTargets(template: string, sent: ReadonlyMap<string, string> = new Map()): NodeRecord[] {
    const held = new Map<string, number>();
    for (const [, e] of this.view.sandboxes) {
      held.set(e.value.node, (held.get(e.value.node) ?? 0) + 1);
    }
    for (const [id, node] of sent) {
      if (this.view.sandboxes.get(id)?.value.node !== node)
        held.set(node, (held.get(node) ?? 0) + 1);
    }
    const nodes = [...this.view.nodes.values()].filter((n) => n.id !== this.id);
    const order = placementOrder(
      {
        nodes,
        running: (id) => held.get(id) ?? 0,
        sample: nodes.length,
        lowMemoryMib: 512,
      },
      { template },
    );
    const byId = new Map(nodes.map((n) => [n.id, n]));
    return order.map((id) => byId.get(id)!);
  }

  /** Stops writing `id`'s entry (it was handed to another node, which writes it now). */
  release(kind: 'sandbox' | 'snapshot', id: string): void {
    this.released.add(id);
    this.writer.forget(kind, id);
  }

  /** This node's record as published now. */
  selfRecord(): NodeRecord {
    const local = this.local;
    return {
      id: this.id,
      url: this.url,
      ...(this.e2bUrl ? { e2b_url: this.e2bUrl } : {}),
      state: this.nodeState,
      version: this.options.version,
      started_at: this.startedAt,
      capacity: local?.capacity() ?? { sandboxes: 0, memory_mib: 0 },
      load: local?.load() ?? { sandboxes: 0, memory_free_mib: 0 },
      templates: local?.templates() ?? {},
      ...(this.drainReport ? { drain: this.drainReport } : {}),
    };
  }

  private async lookup(id: string) {
    try {
      return await this.view.lookup(id);
    } catch {
      throw fail('clusterUnavailable', `cannot look up sandbox ${id}`);
    }
  }

  private expect(): 'adopt' | 0 {
    return this.joined ? 0 : 'adopt';
  }

  private entryOf(record: SandboxRecord): SandboxEntry {
    return {
      node: this.id,
      state: record.state,
      template: record.template,
      parent: record.parent_id,
      snapshot: record.snapshot_id,
      created_at: record.created_at,
      ...(record.state === 'lost' ? { error: record.error ?? 'its VM is gone' } : {}),
    };
  }

  /**
   * The cluster's shared secret `name` (shared-secret.ts), retrying with the join's backoff while
   * etcd cannot be reached: null when the node stops first. Needs no lease, so it can be asked
   * before the node joins.
   */
  async sharedSecret(name: string): Promise<Buffer | null> {
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        return await sharedSecret(this.kv, name);
      } catch (err) {
        if (attempt === 0 || attempt % 10 === 0) {
          this.options.log.warn(
            { err: (err as Error).message, secret: sharedSecretKey(name) },
            "cannot read the cluster's shared secret; retrying",
          );
        }
        await new Promise((r) => setTimeout(r, Math.min(5000, 250 * 2 ** attempt)));
      }
    }
    return null;
  }

  /** Connects (lease, record, catalog), retrying with backoff until it works or the node stops. */
  private async connectLoop(): Promise<void> {
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        await this.connect();
        return;
      } catch (err) {
        if (attempt === 0 || attempt % 10 === 0) {
          this.options.log.warn({ err: (err as Error).message }, 'cannot reach etcd; retrying');
        }
        await new Promise((r) => setTimeout(r, Math.min(5000, 250 * 2 ** attempt)));
      }
    }
  }

  private async connect(): Promise<void> {
    await this.kv.grantLease(this.options.ttlS, (why) => this.leaseLost(why));
    await this.view.start();
    await this.publish(true);
    // Entries naming this node that it no longer holds: deleted while etcd was unreachable, or
    // left by a crash between a create and its answer.
    const local = this.local;
    for (const [id, e] of this.view.sandboxes) {
      if (e.value.node === this.id && !this.writer.has('sandbox', id) && !local?.holds(id)) {
        this.writer.setSandbox(id, null, false, e.modRevision);
      }
    }
    for (const [id, e] of this.view.snapshots) {
      if (
        e.value.node === this.id &&
        !this.writer.has('snapshot', id) &&
        !local?.holdsSnapshot(id)
      ) {
        // Its files are gone from here: a live copy elsewhere takes the entry over, if any.
        if (!(await this.leaveToCopies(id).catch(() => false))) {
          this.writer.setSnapshot(id, null, e.modRevision);
        }
      }
    }
    this.adoptSnapshots();
    this.joined = true;
    this.writer.start();
    this.options.log.info(
      { node: this.id, url: this.url, nodes: this.view.nodes.size },
      'joined the cluster',
    );
  }

  /**
   * The snapshots this node found on disk, against the catalog: one whose entry is gone was
   * deleted while this node was away (its files go); one whose entry is another node's is a copy
   * (this node is put back in its copies if it is not listed: it was, or its node handed the
   * entry over while this one was away).
   */
  private adoptSnapshots(): void {
    const local = this.local;
    for (const id of local?.snapshotIds() ?? []) {
      if (this.writer.has('snapshot', id) || this.takeovers.has(id)) continue;
      const e = this.view.snapshots.get(id)?.value;
      if (!e) {
        const why = 'it was deleted while this node was away';
        this.options.log.warn({ snapshot: id, why }, 'dropping the local copy');
        this.copyIds.delete(id);
        this.release('snapshot', id);
        local!.fenceSnapshot(id, why);
      } else if (e.node !== this.id) {
        this.copyIds.add(id);
        if (!snapshotHolders(e).includes(this.id)) {
          void this.joinCopies(id).catch((err: unknown) =>
            this.options.log.warn({ snapshot: id, err }, 'could not list the local copy'),
          );
        }
      }
    }
  }

  private leaseLost(why: string): void {
    if (this.stopped) return;
    this.options.log.warn({ why }, 'lost the etcd lease: registering again');
    this.lastPublished = '';
    void (async () => {
      for (let attempt = 0; !this.stopped; attempt++) {
        try {
          await this.kv.grantLease(this.options.ttlS, (w) => this.leaseLost(w));
          await this.publish(true);
          this.writer.relive();
          return;
        } catch {
          await new Promise((r) => setTimeout(r, Math.min(5000, 250 * 2 ** attempt)));
        }
      }
    })();
  }

  /**
   * Writes this node's record on its lease when it changed (or `force`). Writes go one at a time, in the order asked, each reading the
   * record when its turn comes: the last one asked carries the latest state (a drain's `draining`
   * and an undrain's `serving` in flight at once end with the later intent, whatever order etcd
   * answers in). A periodic publish joins one already waiting.
   */
  private publish(force: boolean): Promise<void> {
    const waiting = this.nextPublish;
    // A periodic publish joining a forced one waiting is not told of its failure (only a forced
    // publish rejects): its caller, the timer, discards the promise, and hostd stops on an
    // unhandled rejection (fail-fast.ts).
    if (waiting?.force && !force) return waiting.done.catch(() => undefined);
    if (waiting && (waiting.force || !force)) return waiting.done;
    const next: { force: boolean; done: Promise<void> } = { force, done: Promise.resolve() };
    next.done = this.publishing.then(() => {
      if (this.nextPublish === next) this.nextPublish = null;
      return this.publishNow(force);
    });
    this.nextPublish = next;
    this.publishing = next.done.catch(() => undefined);
    return next.done;
  }

  private async publishNow(force: boolean): Promise<void> {
    if (this.stopped && !force) return;
    const record = this.selfRecord();
    // Free memory is rounded so that its noise does not rewrite the record every time.
    const rounded = {
      ...record,
      load: {
        ...record.load,
        memory_free_mib: Math.round(record.load.memory_free_mib / 256) * 256,
      },
    };
    const text = JSON.stringify({ ...rounded, started_at: undefined });
    if (!force && text === this.lastPublished) return;
    const key = KEYS.node(this.id);
    const put = [{ put: key, value: JSON.stringify(rounded), lease: true }];
    try {
      let done = await this.kv.txn([{ key, modRevision: this.recordRevision }], put);
      if (!done.succeeded) {
        // Not what this node last wrote: a new lease (the record went with the old one), or a
        // write of its own that etcd applied after its answer timed out here. This one is newer.
        const now = await this.kv.get(key);
        done = await this.kv.txn([{ key, modRevision: now?.modRevision ?? 0 }], put);
        if (!done.succeeded) throw fail('clusterUnavailable', 'the node record changed meanwhile');
      }
      this.recordRevision = done.revision;
      this.lastPublished = text;
    } catch (err) {
      if (force) throw err;
    }
  }

  private async onConflict(
    kind: 'sandbox' | 'snapshot',
    id: string,
    current: SandboxEntry | SnapshotEntry | null,
  ): Promise<void> {
    const why =
      current === null
        ? 'it was deleted through another node while this one could not see the catalog'
        : `the catalog gives it to node ${current.node}`;
    this.options.log.warn({ [kind]: id, why }, 'fencing the local copy');
    this.released.add(id);
    try {
      if (kind === 'sandbox') await this.local?.fence(id, why);
      else this.local?.fenceSnapshot(id, why);
    } catch (err) {
      this.options.log.error({ err, [kind]: id }, 'could not fence the local copy');
    }
  }
}

/** A snapshot found by its name: its id, its node and when it was taken. */
export interface NamedSnapshot {
  readonly id: string;
  readonly node: string;
  readonly created_at: string;
}

/** The newest of `entries` named `name` (ties: the greater id), or null. */
function newestNamed(
  entries: Iterable<readonly [string, SnapshotEntry]>,
  name: string,
): NamedSnapshot | null {
  let best: NamedSnapshot | null = null;
  for (const [id, e] of entries) {
    if (e.name !== name) continue;
    if (
      !best ||
      e.created_at > best.created_at ||
      (e.created_at === best.created_at && id > best.id)
    ) {
      best = { id, node: e.node, created_at: e.created_at };
    }
  }
  return best;
}
