/**
 * A node's drain (docs/cluster.md): it stops taking creates (`draining`), then hands each of its
 * sandboxes to the least loaded other serving node (core/cluster/hand-over.ts), two at a time,
 * then each of its snapshots that no other live node holds a copy of (to where the sandboxes made
 * from it went, else the least loaded; one with a copy elsewhere is only left to it), and is
 * `drained` once it holds neither. Started by `POST /v1/cluster/nodes/{id}/drain` or by
 * SIGTERM in cluster mode (which then stops, bounded by SERVICE_DRAIN_TIMEOUT_S: what could not
 * be moved is paused in place and comes back with the node, as on a single hostd).
 *
 * A sandbox that failed (its VM died) is not moved: it answers its error where it is until
 * deleted. A sandbox no node can take (none serves its template) stays too, and says so in the
 * log. Sandboxes that appear while it drains (a fork of one that has not moved yet) are moved by
 * a further round.
 *
 * Its progress and end are on the node's record (records.ts DrainReport), so that `GET
 * /v1/cluster` says a drain ended with something left (the node stays `draining`) instead of a
 * client waiting for a `drained` that never comes. Draining again (the route, once the cause
 * is fixed) is a new round that retries everything still here.
 */
import type { Logger } from 'pino';
import { eachAtOnce } from '../each-at-once.js';
import type { SandboxInfo } from '../sandbox.js';
import type { SnapshotInfo } from '../snapshots.js';
import type { ClusterNode } from './cluster-node.js';
import type { HandOver } from './hand-over.js';

/** Hand-overs at once: each is a pause (a burst of disk writes) and a transfer. */
const AT_ONCE = 2;
/** Nodes tried for one sandbox before it is left where it is. */
const TRIES = 2;

export interface DrainResult {
  readonly moved: number;
  /** Sandboxes still here: failed ones, and those no node took. */
  readonly left: number;
  readonly snapshotsMoved: number;
  /** Snapshots still here: those no node took. */
  readonly snapshotsLeft: number;
}

export class Drainer {
  private running: Promise<DrainResult> | null = null;

  constructor(
    private readonly node: ClusterNode,
    private readonly sandboxes: {
      list(): SandboxInfo[];
      listSnapshots(): SnapshotInfo[];
      fenceSnapshot(id: string, why: string): void;
    },
    private readonly handOver: HandOver,
    private readonly log: Logger,
  ) {}

  /** Starts the drain, or joins the one running. */
  drain(): Promise<DrainResult> {
    this.running ??= this.run().finally(() => {
      this.running = null;
    });
    return this.running;
  }

  private async run(): Promise<DrainResult> {
    const started = Date.now();
    const startedAt = new Date(started).toISOString();
    let moved = 0;
    let snapshotsMoved = 0;
    // Shown while it runs (the route's 202 already says it started), and once it ended.
    const report = (end: { left: number; snapshotsLeft: number } | null): void =>
      this.node.reportDrain({
        started_at: startedAt,
        ended_at: end ? new Date().toISOString() : null,
        moved,
        left: end?.left ?? null,
        snapshots_moved: snapshotsMoved,
        snapshots_left: end?.snapshotsLeft ?? null,
      });
    report(null);
    try {
      await this.node.setState('draining');
      const tried = new Set<string>();
      const sent = new Map<string, string>();
      for (;;) {
        const todo = this.sandboxes.list().filter((s) => s.state !== 'failed' && !tried.has(s.id));
        if (todo.length === 0) break;
        await eachAtOnce(todo, AT_ONCE, async (s) => {
          tried.add(s.id);
          if (await this.moveOne(s, sent)) {
            moved++;
            report(null);
          }
        });
      }
      // Then its snapshots, each preferably where the sandboxes made from it went (their frozen
      // state is there already), so that a rolling restart leaves every snapshot usable.
      const triedSnapshots = new Set<string>();
      for (;;) {
        const todo = this.sandboxes
          .listSnapshots()
          .filter((s) => !triedSnapshots.has(s.snapshot_id));
        if (todo.length === 0) break;
        await eachAtOnce(todo, AT_ONCE, async (s) => {
          triedSnapshots.add(s.snapshot_id);
          if (await this.moveSnapshot(s, sent)) {
            snapshotsMoved++;
            report(null);
          }
        });
      }
    } catch (err) {
      // etcd unreachable, say: the drain ends here, and says what it left, as any other end.
      this.log.warn({ err }, 'the drain stopped');
    }
    const left = this.sandboxes.list().length;
    const snapshotsLeft = this.sandboxes.listSnapshots().length;
    // Ended, whatever is left: a node with something left stays `draining` (no creates) until
    // a further drain moves it or the node restarts.
    report({ left, snapshotsLeft });
    await this.node
      .setState(left === 0 && snapshotsLeft === 0 ? 'drained' : 'draining')
      .catch((err: unknown) =>
        // The node's periodic publish carries it once etcd answers.
        this.log.warn({ err }, 'could not publish the end of the drain now'),
      );
    this.log.info(
      { moved, left, snapshotsMoved, snapshotsLeft, ms: Date.now() - started },
      'drain done',
    );
    return { moved, left, snapshotsMoved, snapshotsLeft };
  }

  private async moveSnapshot(s: SnapshotInfo, sent: ReadonlyMap<string, string>): Promise<boolean> {
    const id = s.snapshot_id;
    // Another live node holds its files too: the entry is left to it, nothing is copied.
    const left = await this.node.leaveToCopies(id).catch((err: unknown) => {
      this.log.warn({ snapshot: id, err }, 'could not leave the snapshot to its copies');
      return false;
    });
    if (left) {
      this.sandboxes.fenceSnapshot(id, 'another node holds it');
      return true;
    }
    const targets = this.node.snapshotTargets(id, s.template, sent).slice(0, TRIES);
    if (targets.length === 0) {
      this.log.warn({ snapshot: id, template: s.template }, 'no node can take it; it stays');
      return false;
    }
    for (const to of targets) {
      try {
        await this.handOver.moveSnapshotOut(id, to);
        return true;
      } catch (err) {
        this.log.warn({ snapshot: id, to: to.id, err }, 'snapshot hand-over failed');
      }
    }
    return false;
  }

  private async moveOne(s: SandboxInfo, sent: Map<string, string>): Promise<boolean> {
    const targets = this.node.moveTargets(s.template, sent).slice(0, TRIES);
    if (targets.length === 0) {
      this.log.warn({ sandbox: s.id, template: s.template }, 'no node can take it; it stays');
      return false;
    }
    for (const to of targets) {
      sent.set(s.id, to.id);
      try {
        await this.handOver.moveOut(s.id, to);
        return true;
      } catch (err) {
        sent.delete(s.id);
        this.log.warn({ sandbox: s.id, to: to.id, err }, 'hand-over failed');
      }
    }
    return false;
  }
}
