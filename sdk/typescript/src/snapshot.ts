/**
 * `Snapshot`: a sandbox's whole state (REPL memory and files) kept on disk by hostd, to create
 * any number of sandboxes from later (`Sandbox.create({ snapshot })`). Snapshots survive hostd
 * restarts. Made by `sandbox.snapshot()`.
 */
import {
  resolveConfig,
  type CallOptions,
  type ClientConfig,
  type ConnectionOptions,
} from './config.js';
import { requestJson, requestText } from './http.js';
import type { SnapshotInfo } from './types.js';
import type { components } from './wire.gen.js';

export class Snapshot {
  /** `snap_…`: what `Sandbox.create({ snapshot })` takes. */
  readonly id: string;
  /** The server's description when this object was made (size, source, sandboxes using it). */
  readonly info: SnapshotInfo;
  readonly #config: ClientConfig;

  /** Made by `sandbox.snapshot()`, `Snapshot.get` and `Snapshot.list`. */
  constructor(info: SnapshotInfo, config: ClientConfig) {
    this.id = info.snapshot_id;
    this.info = info;
    this.#config = config;
  }

  /**
   * Every snapshot on the server, newest first.
   *
   * @example
   * for (const s of await Snapshot.list()) console.log(s.id, s.info.size_bytes);
   */
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<Snapshot[]> {
    const config = resolveConfig(opts);
    const body = await requestJson<components['schemas']['SnapshotList']>(config, {
      method: 'GET',
      path: '/v1/snapshots',
      signal: opts.signal,
    });
    return body.snapshots.map((info) => new Snapshot(info, config));
  }

  /** The snapshot `snapshotId`; SnapshotNotFoundError if it does not exist (or was deleted). */
  static async get(
    snapshotId: string,
    opts: ConnectionOptions & CallOptions = {},
  ): Promise<Snapshot> {
    const config = resolveConfig(opts);
    const info = await requestJson<SnapshotInfo>(config, {
      method: 'GET',
      path: snapshotPath(snapshotId),
      signal: opts.signal,
    });
    return new Snapshot(info, config);
  }

  /**
   * Removes the snapshot from the list and from new creates. Sandboxes made from it keep
   * running; hostd frees its files when the last of them goes.
   */
  async delete(opts: CallOptions = {}): Promise<void> {
    await requestText(this.#config, {
      method: 'DELETE',
      path: snapshotPath(this.id),
      signal: opts.signal,
    });
  }

  /** So that `console.log(snapshot)` and template strings show the id. */
  toString(): string {
    return this.id;
  }

  toJSON(): SnapshotInfo {
    return this.info;
  }
}

function snapshotPath(id: string): string {
  return `/v1/snapshots/${encodeURIComponent(id)}`;
}
