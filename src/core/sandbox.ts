/**
 * A sandbox is an id bound to a machine. The binding can change (merge makes a parent id drive
 * the winner's machine), which is why the id, the exec queue and the machine are separate.
 */
import type { Machine } from '../vm/machine.js';
import { SerialQueue } from './serial-queue.js';

/** What GET /v1/sandboxes/{id} returns (docs/api.md). */
export interface SandboxInfo {
  id: string;
  state: 'ready' | 'failed';
  template: string;
  created_at: string;
  last_used_at: string;
  /** The sandbox this one was forked from, if any (it may no longer exist). */
  parent_id: string | null;
  /** True while an exec, fork or merge holds the sandbox; others queue behind it. */
  busy: boolean;
  queued: number;
  /** Why the sandbox failed, when it did. */
  error: string | null;
}

export class Sandbox {
  readonly createdAt = new Date();
  lastUsedAt = Date.now();
  /** Set when the machine failed; every later operation but delete reports it. */
  brokenReason: string | null = null;
  /** Execs, forks and merges, one at a time in arrival order. */
  readonly queue: SerialQueue;

  constructor(
    readonly id: string,
    public template: string,
    public machine: Machine,
    readonly parentId: string | null,
    maxQueued: number,
  ) {
    this.queue = new SerialQueue(maxQueued);
  }

  touch(): void {
    this.lastUsedAt = Date.now();
  }

  info(): SandboxInfo {
    return {
      id: this.id,
      state: this.brokenReason ? 'failed' : 'ready',
      template: this.template,
      created_at: this.createdAt.toISOString(),
      last_used_at: new Date(this.lastUsedAt).toISOString(),
      parent_id: this.parentId,
      busy: this.queue.running,
      queued: this.queue.waiting,
      error: this.brokenReason,
    };
  }
}
