/**
 * Copies of a snapshot on more than one node (docs/cluster.md, Snapshots on any node): a create
 * from a snapshot placed on a node that does not hold it (its holders full, draining or down)
 * fetches the snapshot's files from a live node that holds them, by the hand-over's export and
 * fetch (each file checked against its sha256, a broken fetch resumed with `Range`, a part this
 * node has by id not fetched again), registers it under the same id and joins the entry's
 * `copies`: the next create placed here needs no fetch, and the snapshot serves while any of its
 * holders is alive. The entry stays its node's; a delete of it removes every copy (each node
 * drops its own when the entry goes, core/cluster/cluster-node.ts).
 */
import type { Logger } from 'pino';
import { fail, HostdError, isError } from '../../errors.js';
import type { ClusterNode } from './cluster-node.js';
import type { MovableSandboxes, PeerLink } from './hand-over.js';

export class SnapshotCopies {
  /** Fetches under way, by snapshot id: a second create of the same snapshot waits for it. */
  private readonly fetching = new Map<string, Promise<void>>();

  constructor(
    private readonly node: ClusterNode,
    private readonly sandboxes: Pick<MovableSandboxes, 'moveSnapshotIn' | 'fenceSnapshot'> & {
      holdsSnapshot(id: string): boolean;
    },
    private readonly peers: PeerLink,
    private readonly log: Logger,
  ) {}

  /**
   * Resolves once snapshot `id` is held here: at once when it is, else after its files were
   * fetched from a node holding them. 404 snapshot_not_found when the catalog does not know it
   * (or it was deleted meanwhile), 503 node_unavailable when no holder is alive, 503
   * hand_over_failed when no holder could give it, 503 insufficient_resources when this node
   * has no room for its files (core/copy-room.ts: asked before any is fetched).
   */
  ensure(id: string): Promise<void> {
    if (this.sandboxes.holdsSnapshot(id)) return Promise.resolve();
    let p = this.fetching.get(id);
    if (!p) {
      p = this.fetch(id).finally(() => this.fetching.delete(id));
      this.fetching.set(id, p);
    }
    return p;
  }

  private async fetch(id: string): Promise<void> {
    const started = Date.now();
    const found = await this.node.snapshotEntry(id);
    if (!found) throw fail('snapshotNotFound', id);
    const sources = this.node.snapshotSources(found.value);
    if (sources.length === 0) throw fail('nodeUnavailable', `snapshot ${id}`, found.value.node);
    let last: HostdError | null = null;
    for (const from of sources) {
      let exported;
      try {
        exported = await this.peers.exportSnapshot(from, id);
      } catch (err) {
        last = asFetchError(err, id, from.id);
        continue;
      }
      this.node.expectCopy(id);
      try {
        await this.sandboxes.moveSnapshotIn(exported.record, exported.manifest, (file, offset) =>
          this.peers.fetchFile(from, file, offset),
        );
      } catch (err) {
        this.node.cancelCopy(id);
        // No room here for it (the storage cap, the disk): no other holder changes that, and
        // nothing was fetched. The create goes to the next node.
        if (isError(err, 'insufficientResources')) throw err;
        last = asFetchError(err, id, from.id);
        this.log.warn({ snapshot: id, from: from.id, err }, 'snapshot not copied');
        continue;
      }
      try {
        await this.node.joinCopies(id);
      } catch (err) {
        // Deleted meanwhile (or the catalog is unreachable): no copy stays that it does not list.
        this.node.cancelCopy(id);
        this.node.release('snapshot', id);
        this.sandboxes.fenceSnapshot(id, 'its copy could not be recorded in the catalog');
        throw err;
      }
      this.log.info(
        { snapshot: id, from: from.id, ms: Date.now() - started },
        'snapshot copied from another node',
      );
      return;
    }
    throw last ?? fail('nodeUnavailable', `snapshot ${id}`, found.value.node);
  }
}

/**
 * A failed export or fetch, as the create's answer: 503 (the next node is asked). The words of
 * an error that is not the registry's stay in the log (they may name host paths).
 */
function asFetchError(err: unknown, id: string, from: string): HostdError {
  if (err instanceof HostdError && err.status === 503) return err;
  const why = err instanceof HostdError ? err.message : 'its files could not be fetched';
  return fail('snapshotFetchFailed', id, from, why);
}
