/**
 * The per-request logger (`req.log`), made only when something logs through it.
 *
 * fastify gives every request a child of the server's logger bound to its request id, even with
 * request logging off. pino's `child` serializes the bindings and builds a logger object each
 * time: 65 µs (p50) when requests come a few hundred ms apart on the bench host, for a pool hit's
 * create that never logs through it (docs/architecture.md, "A pool hit's create, session 11").
 * hostd logs through `req.log` only on failures, so the child is made at its first use, with the
 * same bindings and options, and every line it writes is the same as before.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions } from 'pino';

type LogFn = FastifyBaseLogger['info'];
/** A log call's arguments, passed on as they came (pino reads how many there are). */
type LogArgs = [unknown, ...unknown[]];

export class LazyChildLogger implements FastifyBaseLogger {
  private made: FastifyBaseLogger | null = null;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildLoggerOptions,
  ) {}

  /** Whether the child was made (tests). */
  get materialized(): boolean {
    return this.made !== null;
  }

  private get real(): FastifyBaseLogger {
    return (this.made ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    // A level in the options is the child's own; otherwise it is the parent's, read now.
    return this.made ? this.made.level : (this.options.level ?? this.parent.level);
  }

  set level(level: string) {
    this.real.level = level;
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.real.child(bindings, options);
  }

  // On the prototype, not per instance: a request that never logs pays for one small object.
  fatal(...args: LogArgs): void {
    this.real.fatal(...(args as Parameters<LogFn>));
  }
  error(...args: LogArgs): void {
    this.real.error(...(args as Parameters<LogFn>));
  }
  warn(...args: LogArgs): void {
    this.real.warn(...(args as Parameters<LogFn>));
  }
  info(...args: LogArgs): void {
    this.real.info(...(args as Parameters<LogFn>));
  }
  debug(...args: LogArgs): void {
    this.real.debug(...(args as Parameters<LogFn>));
  }
  trace(...args: LogArgs): void {
    this.real.trace(...(args as Parameters<LogFn>));
  }
  silent(...args: LogArgs): void {
    this.real.silent(...(args as Parameters<LogFn>));
  }
}

/** fastify's `childLoggerFactory`: a `LazyChildLogger` in place of `logger.child(...)`. */
export function lazyChildLoggerFactory(
  logger: FastifyBaseLogger,
  bindings: Bindings,
  options: ChildLoggerOptions,
): FastifyBaseLogger {
  return new LazyChildLogger(logger, bindings, options);
}
