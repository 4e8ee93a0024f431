/**
 * Moving a sandbox from one node to another (a drain, docs/cluster.md): the source pauses it and
 * exports its files (core's `moveOut`), its catalog entry goes `moving` by compare-and-set, the
 * target pulls the files it lacks from the source and registers the sandbox paused under the
 * same id, writing the entry `{node: target, state: paused}` by compare-and-set on the `moving`
 * one; then the source discards its copy. The sandbox resumes on the target on its next use,
 * with its REPL state.
 *
 * Meanwhile: on the source, requests for it wait for its turn (held by the move) and then get
 * `503 sandbox_moving` (`Retry-After: 1`), after which any node forwards them to the target; on
 * other nodes, a request waits for the entry to leave `moving` (core/cluster/cluster-node.ts) and
 * is forwarded where it landed. A hand-over that fails puts the entry back to the source's
 * `paused` and keeps the sandbox there.
 *
 * Fork parents and children move independently, each as a paused machine with its own files: a
 * fork point two children share is copied once per target and reused there by id. A merge of a
 * parent and child that ended up on two nodes answers 409 as any merge across nodes does.
 */
import type { Logger } from 'pino';
import { fail, HostdError } from '../../errors.js';
import type { FileFetcher, PausedManifest, StateManifest } from '../../vm/machine.js';
import type { SandboxRecord, SnapshotRecord } from '../journal.js';
import type { OutgoingMove, OutgoingSnapshot } from '../sandbox-manager.js';
import type { SnapshotInfo } from '../snapshots.js';
import type { SandboxInfo } from '../sandbox.js';
import type { ClusterNode } from './cluster-node.js';
import type { NodeRecord } from './records.js';

/** What the source sends the target (the peer hand-over route's body). */
export interface HandOverOffer {
  /** The source node's id: the target fetches the files from it. */
  readonly from: string;
  readonly record: SandboxRecord;
  readonly manifest: PausedManifest;
}

/** What the source of a snapshot sends the target (the peer snapshot hand-over route's body). */
export interface SnapshotOffer {
  readonly from: string;
  /** The revision of the snapshot's entry, still the source's: the target's write compares it. */
  readonly rev: number;
  readonly record: SnapshotRecord;
  readonly manifest: StateManifest;
}

/**
 * A snapshot's record and the manifest of its files, as a node holding it gives them to a node
 * that copies it (core/cluster/snapshot-copies.ts).
 */
export interface SnapshotExport {
  readonly record: SnapshotRecord;
  readonly manifest: StateManifest;
}

/** Node-to-node calls (src/cluster/peer-http.ts over HTTP; a direct call in unit tests). */
export interface PeerLink {
  /** A file of `from`'s export, from byte `offset` on. */
  fetchFile(
    from: NodeRecord,
    file: { readonly path: string; readonly size: number },
    offset: number,
  ): Promise<AsyncIterable<Uint8Array>>;
  /** Asks `to` to take the sandbox over; resolves once it did. Rejects with a HostdError. */
  offer(to: NodeRecord, offer: HandOverOffer): Promise<SandboxInfo>;
  /** Asks `to` to take the snapshot over; resolves once it did. Rejects with a HostdError. */
  offerSnapshot(to: NodeRecord, offer: SnapshotOffer): Promise<SnapshotInfo>;
  /** Asks `from` for snapshot `id`'s record and files, to copy it. Rejects with a HostdError. */
  exportSnapshot(from: NodeRecord, id: string): Promise<SnapshotExport>;
}

/** What a hand-over needs of the sandbox manager. */
export interface MovableSandboxes {
  moveOut(id: string, to: string): Promise<OutgoingMove>;
  moveIn(record: SandboxRecord, manifest: PausedManifest, fetch: FileFetcher): Promise<SandboxInfo>;
  fence(id: string, why: string): Promise<void>;
  moveSnapshotOut(id: string, to: string): Promise<OutgoingSnapshot>;
  moveSnapshotIn(
    record: SnapshotRecord,
    manifest: StateManifest,
    fetch: FileFetcher,
  ): Promise<SnapshotInfo>;
  fenceSnapshot(id: string, why: string): void;
}

export class HandOver {
  constructor(
    private readonly node: ClusterNode,
    private readonly sandboxes: MovableSandboxes,
    private readonly peers: PeerLink,
    private readonly log: Logger,
  ) {}

  /** Hands sandbox `id` (running or paused here) to node `to`; rejects when it stays here. */
  async moveOut(id: string, to: NodeRecord): Promise<void> {
    const started = Date.now();
    const move = await this.sandboxes.moveOut(id, to.id);
    let rev: number;
    try {
      rev = await this.node.beginMove(id, to.id);
    } catch (err) {
      move.abort();
      throw err;
    }
    try {
      await this.peers.offer(to, {
        from: this.node.id,
        record: move.record,
        manifest: move.manifest,
      });
    } catch (err) {
      const why = err instanceof HostdError ? err.message : 'the node did not answer';
      const back = await this.node.abortMove(id, rev).catch(() => false);
      if (!back) {
        // The target wrote the entry after all (its answer was lost): the sandbox is its now.
        this.log.warn({ sandbox: id, to: to.id, why }, 'hand-over answer lost; the target has it');
        await move.finish();
        return;
      }
      move.abort();
      this.log.warn({ sandbox: id, to: to.id, why }, 'hand-over failed; the sandbox stays here');
      throw fail('handOverFailed', `sandbox ${id}`, to.id, why);
    }
    await move.finish();
    this.log.info({ sandbox: id, to: to.id, ms: Date.now() - started }, 'sandbox moved');
  }

  /**
   * Sandbox `id` is paused here and this node has no room to resume it (full, or short of
   * memory): it is handed to the least loaded serving node that has room (its running sandboxes
   * under its capacity), where its next use resumes it. Returns that node, or null when no node
   * has room or took it (it stays here, and resumes here as before).
   */
  async moveToRoom(id: string, template: string): Promise<NodeRecord | null> {
    const roomy = this.node
      .moveTargets(template)
      .filter((n) => this.node.view.liveCount(n.id) < n.capacity.sandboxes)
      .slice(0, 2);
    for (const to of roomy) {
      try {
        await this.moveOut(id, to);
        this.log.info({ sandbox: id, to: to.id }, 'paused sandbox moved to a node with room');
        return to;
      } catch (err) {
        this.log.warn({ sandbox: id, to: to.id, err }, 'could not move it to a node with room');
      }
    }
    return null;
  }

  /** The target's side: takes over the sandbox `offer` describes, fetching from its source. */
  async moveIn(offer: HandOverOffer): Promise<SandboxInfo> {
    const id = offer.record.id;
    const from = this.node.liveNode(offer.from);
    if (!from) throw fail('nodeUnavailable', `sandbox ${id}`, offer.from);
    await this.node.expectTakeover(id, offer.from);
    let info: SandboxInfo;
    try {
      info = await this.sandboxes.moveIn(offer.record, offer.manifest, (file, offset) =>
        this.peers.fetchFile(from, file, offset),
      );
    } catch (err) {
      this.node.cancelTakeover(id);
      throw err;
    }
    try {
      await this.node.confirmSandboxes([id]);
    } catch (err) {
      // Not in the catalog as ours: the source keeps it (its abort puts the entry back).
      this.node.release('sandbox', id);
      await this.sandboxes.fence(id, 'its hand-over could not be recorded in the catalog');
      throw err;
    }
    return info;
  }
  /**
   * Hands snapshot `id` to node `to`; rejects when it stays here. Its frozen state and disk
   * layers travel as a paused sandbox's do: a part the target has by id (a fork point a sandbox
   * made from the snapshot brought there) is not copied again.
   */
  async moveSnapshotOut(id: string, to: NodeRecord): Promise<void> {
    const started = Date.now();
    const move = await this.sandboxes.moveSnapshotOut(id, to.id);
    try {
      const rev = await this.node.beginSnapshotMove(id);
      await this.peers.offerSnapshot(to, {
        from: this.node.id,
        rev,
        record: move.record,
        manifest: move.manifest,
      });
    } catch (err) {
      if (!(await this.node.snapshotTakenBy(id, to.id))) {
        move.abort();
        const why = err instanceof HostdError ? err.message : 'the node did not answer';
        this.log.warn({ snapshot: id, to: to.id, why }, 'snapshot hand-over failed; it stays');
        throw err instanceof HostdError && err.code === 'hand_over_failed'
          ? err
          : fail('handOverFailed', `snapshot ${id}`, to.id, why);
      }
      this.log.warn(
        { snapshot: id, to: to.id },
        'snapshot hand-over answer lost; the target has it',
      );
    }
    // Its entry is the target's now: this node lets it go without writing it.
    this.node.release('snapshot', id);
    move.finish();
    this.log.info({ snapshot: id, to: to.id, ms: Date.now() - started }, 'snapshot moved');
  }

  /** The target's side: takes over the snapshot `offer` describes, fetching from its source. */
  async moveSnapshotIn(offer: SnapshotOffer): Promise<SnapshotInfo> {
    const id = offer.record.id;
    const from = this.node.liveNode(offer.from);
    if (!from) throw fail('nodeUnavailable', `snapshot ${id}`, offer.from);
    await this.node.expectSnapshotTakeover(id, offer.from, offer.rev);
    let info: SnapshotInfo;
    try {
      info = await this.sandboxes.moveSnapshotIn(offer.record, offer.manifest, (file, offset) =>
        this.peers.fetchFile(from, file, offset),
      );
    } catch (err) {
      this.node.cancelTakeover(id);
      throw err;
    }
    try {
      await this.node.confirmSnapshot(id);
    } catch (err) {
      // Not in the catalog as ours (deleted meanwhile through another node): the source keeps
      // what it has, this copy goes.
      this.node.release('snapshot', id);
      this.sandboxes.fenceSnapshot(id, 'its hand-over could not be recorded in the catalog');
      throw err;
    }
    return info;
  }
}
