/** How `sbx` reports a failure: one line on stderr, and the exit status to use. */
import { describeError, isHostdError } from '../errors.js';
import { UsageError } from './command.js';

/** Writes the error's line and returns the status: 2 for usage mistakes, else 1. */
export function reportError(err: unknown, name: string | undefined): number {
  if (err instanceof UsageError) {
    const help = err.command ? `sbx ${err.command} --help` : 'sbx --help';
    process.stderr.write(`sbx: ${err.message}\nRun '${help}' for usage.\n`);
    return 2;
  }
  if (isHostdError(err)) {
    process.stderr.write(`sbx: ${describeError(err)}: ${err.message}\n`);
    return 1;
  }
  // Not an API error: a bad --url, an unreadable file, or a bug. One line unless debugging.
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`sbx: ${name ?? 'error'}: ${message}\n`);
  if (process.env.SERVICE_SBX_DEBUG && err instanceof Error && err.stack)
    process.stderr.write(`${err.stack}\n`);
  return 1;
}
