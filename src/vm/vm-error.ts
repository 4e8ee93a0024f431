/**
 * How a machine operation fails: one error type with a kind from a small set, and the operation
 * it failed in (Firecracker's per-operation error enums, flattened). Core decides by the kind and
 * tells clients `clientReason`, words of this module with no host detail; the raw text (QEMU's
 * message, an fs error naming a file under the data directory) stays in `message`, and with the
 * console tail goes to hostd's log next to the sandbox id.
 *
 * Every method of the Hypervisor and Machine ports (vm/machine.ts) rejects with a VmError: the
 * implementation wraps whatever its internals threw at that boundary (`asVmError`,
 * vm/qemu/as-vm-error.ts). It lives beside the port, outside the rooms, so that every room can
 * throw it (storage/page-delta.ts does).
 */

/** Why a machine operation failed, in a client's terms. */
export type VmErrorKind =
  /** QEMU did not start, or its guest did not come up (boot, restore, resume, adopt). */
  | 'start_failed'
  /** The VM exited, or its channels closed, while the operation ran. */
  | 'died'
  /** The guest agent did not answer in time. */
  | 'agent_unresponsive'
  /** The guest agent answered with a refusal (an environment, a network port). */
  | 'guest_refused'
  /** QEMU refused or did not answer a command. */
  | 'hypervisor'
  /** A file of the host failed to be read or written (memory image, page delta, disk). */
  | 'io'
  /** Saved state (a paused machine's files, a frozen state) is damaged, incompatible or gone. */
  | 'state_corrupt'
  /** An operation the machine cannot do (not a restored clone, another hypervisor's object). */
  | 'unsupported'
  /** The host's disk has no room for the files an import would fetch (refused before any). */
  | 'no_space';

/** The port methods, as errors and logs name them. */
export type VmOperation =
  | 'boot'
  | 'restore'
  | 'resume'
  | 'adopt'
  | 'open_state'
  | 'open_paused'
  | 'export'
  | 'import'
  | 'capture'
  | 'pause'
  | 'prepare_fork'
  | 'set_env'
  | 'set_network'
  | 'warm_up'
  | 'exec';

const KIND_WORDS: Record<VmErrorKind, string> = {
  start_failed: 'the VM did not start',
  died: 'the VM stopped running',
  agent_unresponsive: 'the guest agent did not answer in time',
  guest_refused: 'the guest refused it',
  hypervisor: 'the hypervisor refused a command',
  io: 'a host file operation failed',
  state_corrupt: 'the saved state is damaged or incompatible',
  unsupported: 'the machine cannot do that',
  no_space: "not enough disk space on the host for the files it needs (the template build's)",
};

export class VmError extends Error {
  /**
   * @param kind what went wrong, in a client's terms
   * @param message the raw detail, for hostd's log only (may name host files)
   */
  constructor(
    readonly kind: VmErrorKind,
    message: string,
    options: {
      operation?: VmOperation;
      /** The guest console and QEMU log tail, for hostd's log. */
      consoleTail?: string;
      /** What the guest said when it refused (`guest_refused`): the guest's words, safe to show. */
      guestDetail?: string;
      cause?: unknown;
    } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'VmError';
    this.operation = options.operation;
    this.consoleTail = options.consoleTail ?? '';
    this.guestDetail = options.guestDetail;
  }

  /** The port method it failed in; set by the boundary (`asVmError`) when not by the thrower. */
  readonly operation: VmOperation | undefined;
  readonly consoleTail: string;
  readonly guestDetail: string | undefined;

  /** What a client may read: the kind in words (and the guest's own words for a refusal). */
  get clientReason(): string {
    const words = KIND_WORDS[this.kind];
    return this.guestDetail === undefined ? words : `${words}: ${this.guestDetail.slice(0, 300)}`;
  }

  /** This error as a failure of `operation` (and with `consoleTail`, when it has none). */
  in(operation: VmOperation | undefined, consoleTail = ''): VmError {
    const sameOperation = this.operation !== undefined || operation === undefined;
    if (sameOperation && (this.consoleTail || !consoleTail)) return this;
    return new VmError(this.kind, this.message, {
      operation: this.operation ?? operation,
      consoleTail: this.consoleTail || consoleTail,
      ...(this.guestDetail === undefined ? {} : { guestDetail: this.guestDetail }),
      cause: this.cause,
    });
  }
}
