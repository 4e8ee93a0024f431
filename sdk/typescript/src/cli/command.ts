/** What every `sbx` command is made of, and the small helpers they share. */
import type { ParseArgsConfig } from 'node:util';
import type { ConnectionOptions } from '../config.js';

export type Options = NonNullable<ParseArgsConfig['options']>;
export type Values = Record<string, string | boolean | string[] | undefined>;

export interface Command {
  usage: string;
  summary: string;
  details: string;
  options: Options;
  run(positionals: string[], values: Values, conn: ConnectionOptions): Promise<number>;
}

/** A mistake in the command line: message, hint, exit status 2. */
export class UsageError extends Error {
  constructor(
    message: string,
    readonly command?: string,
  ) {
    super(message);
  }
}

export function noPositionals(name: string, positionals: string[]): void {
  if (positionals.length > 0)
    throw new UsageError(`${name} takes no arguments, got: ${positionals.join(' ')}`, name);
}

export function onePositional(name: string, positionals: string[], what: string): string {
  if (positionals.length !== 1) throw new UsageError(`${name} needs exactly one ${what}`, name);
  return positionals[0]!;
}

/** `--env K=V` given any number of times, as an object; undefined when never given. */
export function keyValues(
  name: string,
  flag: string,
  values: string[] | undefined,
): Record<string, string> | undefined {
  if (values === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const pair of values) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new UsageError(`${flag} takes NAME=VALUE, got ${pair}`, name);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

/** A positive number of seconds, as milliseconds. */
export function secondsOption(
  name: string,
  flag: string,
  raw: string | undefined,
): number | undefined {
  if (raw === undefined) return undefined;
  const seconds = Number(raw);
  if (!Number.isFinite(seconds) || seconds <= 0) {
    throw new UsageError(`${flag} must be a positive number of seconds, got ${raw}`, name);
  }
  return seconds * 1000;
}

/** Rows as left-aligned columns two spaces apart, the first row being the headings. */
export function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]): string =>
    r
      .map((cell, i) => cell.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return rows.map((r) => `${line(r)}\n`).join('');
}

/** `1.5 MiB`: sizes as people read them. */
export function humanBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(1)} ${units[unit]}`;
}
