/**
 * How the QEMU machine classifies what its internals threw, at the port's boundary: by type,
 * never by wording (vm/vm-error.ts has the kinds). It is qemu's: it knows the errors of the QMP
 * client and of the agent channel.
 */
import { AgentError } from '../channels/agent-channel.js';
import { VmError, type VmErrorKind, type VmOperation } from '../vm-error.js';
import { QmpError } from './qmp.js';

/**
 * `err` as a VmError of `operation`. What is not one already is classified by its type, never
 * by its wording: on a machine that is no longer alive it `died`; an agent that did not answer
 * is `agent_unresponsive`; QMP's errors are `hypervisor`; anything else (a failed system call,
 * a plain Error of the vm layer) is `fallback`, the kind of the operation's usual failure.
 */
export function toVmError(
  err: unknown,
  operation: VmOperation | undefined,
  fallback: VmErrorKind,
  alive = true,
): VmError {
  if (err instanceof VmError) return operation === undefined ? err : err.in(operation);
  const message = err instanceof Error ? err.message : String(err);
  const kind: VmErrorKind = !alive
    ? 'died'
    : err instanceof AgentError
      ? 'agent_unresponsive'
      : err instanceof QmpError
        ? 'hypervisor'
        : fallback;
  return new VmError(kind, message, { ...(operation ? { operation } : {}), cause: err });
}

/** What each operation's failures are when nothing says otherwise (see `toVmError`). */
const USUAL_FAILURE: Record<VmOperation, VmErrorKind> = {
  boot: 'start_failed',
  restore: 'start_failed',
  resume: 'start_failed',
  adopt: 'start_failed',
  open_state: 'state_corrupt',
  open_paused: 'state_corrupt',
  export: 'io',
  import: 'io',
  capture: 'io',
  pause: 'io',
  prepare_fork: 'io',
  set_env: 'agent_unresponsive',
  set_network: 'agent_unresponsive',
  warm_up: 'agent_unresponsive',
  exec: 'died',
};

/**
 * Runs a port method's body, its failures as VmErrors of `operation`. `alive` tells whether the
 * machine still runs once it failed (a dead machine's failures are `died`).
 */
export async function asVmError<T>(
  operation: VmOperation,
  work: () => Promise<T>,
  alive: () => boolean = () => true,
): Promise<T> {
  try {
    return await work();
  } catch (err) {
    throw toVmError(err, operation, USUAL_FAILURE[operation], alive());
  }
}
