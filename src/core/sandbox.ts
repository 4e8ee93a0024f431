/**
 * A sandbox is an id bound to a VM. The binding can change (merge makes a parent id drive the
 * winner's VM), which is why the id, the exec queue and the VM are separate things.
 */
import type { Vm } from '../vm/vm.js';
import { SerialQueue } from './serial-queue.js';

/** What GET /v1/sandboxes/{id} returns. */
export interface SandboxInfo {
  id: string;
  state: 'ready';
  template: string;
  created_at: string;
  last_used_at: string;
  /** The sandbox this one was forked from, if any (it may no longer exist). */
  parent_id: string | null;
  /** True while an exec, fork or merge holds the sandbox; others queue behind it. */
  busy: boolean;
  queued: number;
}

export class Sandbox {
  readonly createdAt = new Date();
  lastUsedAt = Date.now();
  /** Set when the VM failed; every later operation but delete reports it as an executor error. */
  brokenReason: string | null = null;
  readonly queue: SerialQueue;

  constructor(
    readonly id: string,
    public template: string,
    public vm: Vm,
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
      state: 'ready',
      template: this.template,
      created_at: this.createdAt.toISOString(),
      last_used_at: new Date(this.lastUsedAt).toISOString(),
      parent_id: this.parentId,
      busy: this.queue.running,
      queued: this.queue.waiting,
    };
  }
}
