/**
 * Machine-layer failures as clients see them. A VmError (vm/machine.ts) carries a kind in a
 * client's terms and the raw text (QEMU's words, a file under the data directory); clients get
 * the registry's message with the kind's words, and hostd's log gets everything, with the
 * sandbox id and the console tail. Nothing of a VM failure reaches a client unfiltered.
 */
import type { Logger } from 'pino';
import { failWith, HostdError } from '../errors.js';
import { VmError } from '../vm/machine.js';

/** Said of a failure that is not a VmError: a bug, whose text stays in the log. */
const UNEXPECTED = "an unexpected failure (hostd's log has the details)";

/** What a client may read of `err`, a machine operation's failure. */
export function clientReason(err: unknown): string {
  if (err instanceof VmError) return err.clientReason;
  if (err instanceof HostdError) return err.message;
  return UNEXPECTED;
}

/** Where a failure happened, for the log line. */
export interface FailureContext {
  readonly sandbox?: string;
  readonly template?: string;
  readonly vm?: string;
  readonly snapshot?: string;
}

/** Logs a machine operation's failure whole: raw text, kind, operation and console tail. */
export function logMachineFailure(
  log: Logger,
  err: unknown,
  context: FailureContext,
  what: string,
): void {
  const vm = err instanceof VmError ? err : null;
  log.error(
    { ...context, err, kind: vm?.kind, operation: vm?.operation },
    `VM failure: could not ${what}`,
  );
  if (vm?.consoleTail) log.error({ ...context, tail: vm.consoleTail }, 'VM failure log tail');
}

/**
 * A machine-layer failure as registry entry `vmStartFailed` or `vmOperationFailed` (`what`
 * failed), logged with `context`. HostdErrors (a 503 of admission, a 404) pass as they are.
 */
export function asMachineError(
  err: unknown,
  log: Logger,
  context: FailureContext,
  ...entry: ['vmStartFailed'] | ['vmOperationFailed', string]
): HostdError {
  if (err instanceof HostdError) return err;
  const what = entry[0] === 'vmStartFailed' ? 'start the VM' : entry[1];
  logMachineFailure(log, err, context, what);
  const why = clientReason(err);
  // The host's disk has no room (refused before anything was fetched): retry later, or on
  // another node (a drain's or a placement's next one).
  if (err instanceof VmError && err.kind === 'no_space') {
    return failWith(err, 'insufficientResources', why);
  }
  return entry[0] === 'vmStartFailed'
    ? failWith(err, 'vmStartFailed', why)
    : failWith(err, 'vmOperationFailed', entry[1], why);
}
