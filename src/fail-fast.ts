/**
 * What hostd does with a bug it did not catch: log it and exit. Its state after an uncaught
 * exception is unknown (a half-updated record, a lock never released), and serving on from it
 * can corrupt sandboxes. Exiting loses nothing that matters: the VMs are separate processes
 * that outlive hostd, and the next start (systemd's `Restart=on-failure`, contrib/systemd)
 * re-adopts them with their state; only the requests in flight are cut.
 */
import type { Logger } from 'pino';

/** hostd's exit code after a crash (EX_SOFTWARE): distinct from a refused start (1, 2). */
export const CRASH_EXIT_CODE = 70;

/** Installs the handlers: an uncaught exception or unhandled rejection logs and exits. */
export function exitOnUncaught(
  log: Logger,
  exit: (code: number) => void = (code) => process.exit(code),
): void {
  const crash = (what: string) => (err: unknown) => {
    log.fatal({ err }, `${what}: exiting; the VMs run on and the next start re-adopts them`);
    exit(CRASH_EXIT_CODE);
  };
  process.on('uncaughtException', crash('uncaught exception'));
  process.on('unhandledRejection', crash('unhandled rejection'));
}
