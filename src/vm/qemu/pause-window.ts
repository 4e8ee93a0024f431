/**
 * The moments a running guest is stopped so that its memory, device state and disk can be
 * taken at one instant (a capture, a pause), and the rule that makes them fail safe: a guest
 * that QEMU will not run again is a lost machine, never a sandbox that reads `ready` while its
 * guest stands still (its next exec would hang until a timer gave up).
 */
import { VmError } from '../vm-error.js';

/** The guest's run state, as QEMU controls it (QMP `stop` / `cont`). */
export interface GuestRunState {
  stop(): Promise<void>;
  cont(): Promise<void>;
  /**
   * The machine cannot run again: kill it and report its death (`why`, in a client's terms), so
   * that its sandbox fails at once.
   */
  lose(why: string, err: unknown): void;
}

/**
 * Runs `work` with the guest stopped. `resume`: `always` runs it again afterwards (a capture:
 * the machine goes on); `on-failure` only when `work` failed (a pause: on success the machine
 * is written to disk and stopped for good). When the guest cannot be run again, the machine is
 * lost (`lose`); `work`'s own error, if it failed, is the one thrown.
 */
export async function whileStopped<T>(
  guest: GuestRunState,
  resume: 'always' | 'on-failure',
  work: () => Promise<T>,
): Promise<T> {
  await guest.stop();
  let result: T;
  try {
    result = await work();
  } catch (err) {
    await runAgain(guest);
    throw err;
  }
  if (resume === 'always' && !(await runAgain(guest))) {
    throw new VmError('died', 'the guest could not be run again after it was stopped');
  }
  return result;
}

/** `cont`; false (the machine lost) when QEMU would not. */
async function runAgain(guest: GuestRunState): Promise<boolean> {
  try {
    await guest.cont();
    return true;
  } catch (err) {
    guest.lose('the VM could not be run again after it was stopped', err);
    return false;
  }
}
