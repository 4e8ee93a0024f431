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
 * client waiting for a `drained` that never comes; once ended it names what it left (at most
 * LEFT_IDS_SHOWN ids of each kind). Draining again (the route, once the cause is fixed) is a
 * new round that retries everything still here. An undrain (`POST
 * /v1/cluster/nodes/{id}/undrain`) returns the node to `serving` at once and stops a running
 * round from starting further moves; the hand-overs under way finish.
 */
import type { Logger } from 'pino';
import { fail } from '../../errors.js';
import { eachAtOnce } from '../each-at-once.js';
import type { SandboxInfo } from '../sandbox.js';
import type { SnapshotInfo } from '../snapshots.js';
import type { ClusterNode } from './cluster-node.js';
import type { HandOver } from './hand-over.js';
import { LEFT_IDS_SHOWN } from './records.js';

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

/** One drain round: its result once it ends, and whether an undrain stopped its moves. */
interface Round {
  result: Promise<DrainResult>;
  /** Set by an undrain: no further move starts; those under way finish. */
  stopped: boolean;
  /** When the undrain came (the report's `undrained_at`). */
  undrainedAt: string | null;
}

/** What a round's end reports: its counts, and the ids of what it left (at most LEFT_IDS_SHOWN). */
interface DrainEnd {
  readonly moved: number;
  readonly snapshotsMoved: number;
  readonly left: number;
  readonly snapshotsLeft: number;
  readonly sandboxIds: string[];
  readonly snapshotIds: string[];
}

const NOTHING: DrainResult = { moved: 0, left: 0, snapshotsMoved: 0, snapshotsLeft: 0 };

export class Drainer {
  /** The round running now (an undrained one still finishing its moves included), or null. */
  private current: Round | null = null;

  constructor(
    private readonly node: ClusterNode,
    private readonly sandboxes: {
      list(): SandboxInfo[];
      listSnapshots(): SnapshotInfo[];
      snapshotsSettled(): Promise<void>;
      fenceSnapshot(id: string, why: string): void;
    },
    private readonly handOver: HandOver,
    private readonly log: Logger,
  ) {}

  /**
   * Starts the drain, or joins the one running. A round stopped by an undrain is not joined: a
   * new round starts (the node is `draining` at once) and moves once that one's last moves end.
   */
  drain(): Promise<DrainResult> {
    if (this.current && !this.current.stopped) return this.current.result;
    const previous = this.current?.result;
    const round: Round = { result: Promise.resolve(NOTHING), stopped: false, undrainedAt: null };
    this.current = round;
    round.result = this.run(round, previous).finally(() => {
      if (this.current === round) this.current = null;
    });
    return round.result;
  }

  /**
   * `POST /v1/cluster/nodes/{id}/undrain`: the node is `serving` again (takes creates) at once.
   * A running round starts no further move; the hand-overs under way finish (each is a
   * compare-and-set on its catalog entry: stopping one midway would leave a sandbox to recover),
   * and the round then ends with its report, leaving the node `serving`. A serving node with no
   * round running is left as it is (an undrain asked twice is the same as once). A node whose
   * hostd stops (its SIGTERM's drain, or SIGINT) is refused, `409 cluster_conflict`, and nothing
   * changes: it takes no creates until it is gone, and stopping its drain would only pause in
   * place what could have moved.
   */
  async undrain(): Promise<void> {
    if (this.node.isLeaving) throw fail('nodeStopping', this.node.id);
    const round = this.current;
    if (this.node.state === 'serving' && (!round || round.stopped)) return;
    const now = new Date().toISOString();
    if (round) {
      round.stopped = true;
      round.undrainedAt = now;
    }
    // The last report says the node was undrained (a running round's own next report keeps it).
    const report = this.node.selfRecord().drain;
    if (report) this.node.reportDrain({ ...report, undrained_at: now });
    // Not leaving: checked above, and nothing awaited since (setState's own check passes).
    await this.node.setState('serving').catch((err: unknown) =>
      // Serving here at once; the node's periodic publish tells the others once etcd answers.
      this.log.warn({ err }, 'could not publish the undrain now'),
    );
    this.log.info({ during: round !== null }, 'undrained: taking creates again');
  }

  private async run(
    round: Round,
    previous: Promise<DrainResult> | undefined,
  ): Promise<DrainResult> {
    const started = Date.now();
    const startedAt = new Date(started).toISOString();
    let moved = 0;
    let snapshotsMoved = 0;
    // Shown while it runs (the route's 202 already says it started), and once it ended; a round
    // that a newer one replaced (after an undrain) reports no more.
    const report = (end: Omit<DrainEnd, 'moved' | 'snapshotsMoved'> | null): void => {
      if (this.current !== round) return;
      this.node.reportDrain({
        started_at: startedAt,
        ended_at: end ? new Date().toISOString() : null,
        moved,
        left: end?.left ?? null,
        snapshots_moved: snapshotsMoved,
        snapshots_left: end?.snapshotsLeft ?? null,
        left_sandboxes: end?.sandboxIds ?? null,
        left_snapshots: end?.snapshotIds ?? null,
        undrained_at: round.undrainedAt,
      });
    };
    report(null);
    try {
      await this.node.setState('draining');
      // A round an undrain stopped may still be finishing a hand-over: this one waits for it,
      // so that one sandbox is never offered twice at once.
      await previous?.catch(() => undefined);
      const tried = new Set<string>();
      const sent = new Map<string, string>();
      for (;;) {
        const todo = this.sandboxes.list().filter((s) => s.state !== 'failed' && !tried.has(s.id));
        if (todo.length === 0 || round.stopped) break;
        await eachAtOnce(todo, AT_ONCE, async (s) => {
          if (round.stopped) return;
          tried.add(s.id);
          if (await this.moveOne(s, sent, round)) {
            moved++;
            report(null);
          }
        });
      }
      // Then its snapshots, each preferably where the sandboxes made from it went (their frozen
      // state is there already), so that a rolling restart leaves every snapshot usable.
      // A snapshot captured before its sandbox moved may still sync its files, not listed yet.
      await this.sandboxes.snapshotsSettled();
      const triedSnapshots = new Set<string>();
      for (;;) {
        const todo = this.sandboxes
          .listSnapshots()
          .filter((s) => !triedSnapshots.has(s.snapshot_id));
        if (todo.length === 0 || round.stopped) break;
        await eachAtOnce(todo, AT_ONCE, async (s) => {
          if (round.stopped) return;
          triedSnapshots.add(s.snapshot_id);
          if (await this.moveSnapshot(s, sent, round)) {
            snapshotsMoved++;
            report(null);
          }
        });
      }
    } catch (err) {
      // etcd unreachable, say: the drain ends here, and says what it left, as any other end.
      this.log.warn({ err }, 'the drain stopped');
    }
    // Stopped before it waited (its `draining` not published): still not before the round it
    // replaced, whose moves would be counted as left and, once this one is no longer current,
    // offered again by the next round, which would not wait for them.
    await previous?.catch(() => undefined);
    const sandboxIds = this.sandboxes
      .list()
      .map((s) => s.id)
      .sort();
    const snapshotIds = this.sandboxes
      .listSnapshots()
      .map((s) => s.snapshot_id)
      .sort();
    const end: DrainEnd = {
      moved,
      snapshotsMoved,
      left: sandboxIds.length,
      snapshotsLeft: snapshotIds.length,
      sandboxIds: sandboxIds.slice(0, LEFT_IDS_SHOWN),
      snapshotIds: snapshotIds.slice(0, LEFT_IDS_SHOWN),
    };
    report(end);
    // Ended, whatever is left: a node with something left stays `draining` (no creates) until
    // a further drain moves it, an undrain, or a restart. An undrained one stays `serving`, and
    // one a newer round replaced is that round's.
    if (!round.stopped) {
      await this.node
        .setState(end.left === 0 && end.snapshotsLeft === 0 ? 'drained' : 'draining')
        .catch((err: unknown) =>
          // The node's periodic publish carries it once etcd answers.
          this.log.warn({ err }, 'could not publish the end of the drain now'),
        );
    }
    this.log.info(
      {
        moved,
        left: end.left,
        snapshotsMoved,
        snapshotsLeft: end.snapshotsLeft,
        undrained: round.stopped,
        ms: Date.now() - started,
      },
      'drain done',
    );
    return { moved, left: end.left, snapshotsMoved, snapshotsLeft: end.snapshotsLeft };
  }

  private async moveSnapshot(
    s: SnapshotInfo,
    sent: ReadonlyMap<string, string>,
    round: Round,
  ): Promise<boolean> {
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
      // Undrained meanwhile: a hand-over to the next node would be a move started after it.
      if (round.stopped) return false;
      try {
        await this.handOver.moveSnapshotOut(id, to);
        return true;
      } catch (err) {
        this.log.warn({ snapshot: id, to: to.id, err }, 'snapshot hand-over failed');
      }
    }
    return false;
  }

  private async moveOne(s: SandboxInfo, sent: Map<string, string>, round: Round): Promise<boolean> {
    const targets = this.node.moveTargets(s.template, sent).slice(0, TRIES);
    if (targets.length === 0) {
      this.log.warn({ sandbox: s.id, template: s.template }, 'no node can take it; it stays');
      return false;
    }
    for (const to of targets) {
      // Undrained meanwhile (a hand-over that failed): trying the next node would be a move
      // started after the undrain, taking away a sandbox of a node serving again.
      if (round.stopped) return false;
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
