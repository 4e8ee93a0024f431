/**
 * Execs in tests: whole results (`run`), streams read event by event (`openExec`), and
 * `holdSandbox`, an exec that keeps a sandbox busy until the test lets go. Holding is how a
 * test puts a request behind a running exec without guessing how long anything takes: the
 * held cell runs until the test releases it, whatever the load on the host.
 */
import type { Api } from './hostd.js';
import { assertNoHostDetails } from './host-details.js';

/** One NDJSON event of an exec response (docs/api.md, Exec). */
export interface ExecEvent {
  type: 'stdout' | 'stderr' | 'display' | 'exit';
  data: string | number | Record<string, unknown>;
  seq: number;
  ts: number;
  error?: string;
}

/**
 * The events of NDJSON `text`. What hostd itself says in them (an `exit` event's `error`, its
 * `hostd: ...` stderr lines) is checked for host details, like every error answer.
 */
function parseLines(api: Api, text: string): ExecEvent[] {
  const events = text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as ExecEvent);
  for (const e of events) {
    const hostd =
      e.type === 'exit'
        ? e.error
        : e.type === 'stderr' && typeof e.data === 'string' && e.data.startsWith('hostd: ')
          ? e.data
          : undefined;
    if (hostd !== undefined) assertNoHostDetails(`an exec's ${e.type} event`, hostd, api.hostDirs);
  }
  return events;
}

/** Runs an exec to its end and returns its events; throws unless the answer is a 200 stream. */
export async function execEvents(
  api: Api,
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<ExecEvent[]> {
  const res = await api.request('POST', `/v1/sandboxes/${id}/exec`, { code, ...extra });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`exec returned ${res.status}: ${text}`);
  return parseLines(api, text);
}

/** stdout, stderr joined (one line each) and the exit code of an exec. */
export async function run(
  api: Api,
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<{ stdout: string; stderr: string; exit: number; events: ExecEvent[] }> {
  const events = await execEvents(api, id, code, extra);
  const join = (t: string): string =>
    events
      .filter((e) => e.type === t)
      .map((e) => `${e.data}\n`)
      .join('');
  const exit = events.find((e) => e.type === 'exit');
  return {
    stdout: join('stdout'),
    stderr: join('stderr'),
    exit: exit ? Number(exit.data) : NaN,
    events,
  };
}

/** An exec response read as it arrives. */
export interface ExecStream {
  /** The response itself (status and headers are known once openExec resolves). */
  response: Response;
  /** The next event, or null once the response has ended. */
  next(): Promise<ExecEvent | null>;
  /** Reads events up to and including the first one `match` accepts; throws if none does. */
  until(what: string, match: (e: ExecEvent) => boolean): Promise<ExecEvent[]>;
  /** Every event left, to the end of the response. */
  rest(): Promise<ExecEvent[]>;
  /** Closes the connection: hostd interrupts the exec (docs/api.md, Client disconnect). */
  abort(): void;
}

/**
 * Sends an exec and resolves as soon as hostd sends its status and headers (while the exec
 * may still run), without reading the body.
 */
export async function openExec(
  api: Api,
  id: string,
  body: Record<string, unknown>,
): Promise<ExecStream> {
  const ac = new AbortController();
  const response = await fetch(`${api.url}/v1/sandboxes/${id}/exec`, {
    method: 'POST',
    headers: { ...api.headers, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: ac.signal,
  });
  // Taken on the first read, so that a caller can still read an error answer as text.
  let reader: ReadableStreamDefaultReader<Uint8Array> | null = null;
  const decoder = new TextDecoder();
  const ready: ExecEvent[] = [];
  let buf = '';
  let ended = false;
  const next = async (): Promise<ExecEvent | null> => {
    while (ready.length === 0 && !ended) {
      reader ??= response.body!.getReader();
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        buf += decoder.decode();
      } else {
        buf += decoder.decode(value, { stream: true });
      }
      const lines = buf.split('\n');
      buf = ended ? '' : lines.pop()!;
      ready.push(...parseLines(api, lines.join('\n')));
    }
    return ready.shift() ?? null;
  };
  return {
    response,
    next,
    async until(what, match) {
      const seen: ExecEvent[] = [];
      for (;;) {
        const e = await next();
        if (e === null) {
          throw new Error(`the exec ended before ${what}; events: ${JSON.stringify(seen)}`);
        }
        seen.push(e);
        if (match(e)) return seen;
      }
    },
    async rest() {
      const all: ExecEvent[] = [];
      for (let e = await next(); e !== null; e = await next()) all.push(e);
      return all;
    },
    abort: () => ac.abort(),
  };
}

/** A sandbox kept busy by a running exec until `release()`. */
export interface Hold {
  /** What the held cell printed before it started holding (its `before` code's output). */
  printed: ExecEvent[];
  /**
   * Lets the sandbox go: closes the held exec's connection, which interrupts the cell; its
   * `after` code runs (in a `finally`) before the next request in the sandbox's queue starts.
   */
  release(): void;
}

const HOLDING = 'testkit: holding the sandbox';

/**
 * Starts a Python exec on `id` that runs `before`, then holds the sandbox until `release()`,
 * then runs `after`. Resolves once the cell is running (its holding line arrived), so any
 * request sent after this waits behind it.
 *
 * @example
 * const hold = await holdSandbox(hostd, id, { after: 'log.append("first")' });
 * const second = run(hostd, id, 'log.append("second")');
 * await untilSandbox(hostd, id, 'the second exec to queue', (s) => s.queued === 1);
 * hold.release();
 */
export async function holdSandbox(
  api: Api,
  id: string,
  { before = '', after = 'pass' }: { before?: string; after?: string } = {},
): Promise<Hold> {
  const indent = (code: string): string =>
    code
      .split('\n')
      .map((l) => `    ${l}`)
      .join('\n');
  const code = [
    before,
    'import time as _testkit_time',
    'try:',
    `    print(${JSON.stringify(HOLDING)}, flush=True)`,
    '    while True:',
    '        _testkit_time.sleep(60)',
    'finally:',
    indent(after),
  ].join('\n');
  const stream = await openExec(api, id, { code });
  if (stream.response.status !== 200) {
    throw new Error(
      `holding exec returned ${stream.response.status}: ${await stream.response.text()}`,
    );
  }
  const seen = await stream.until('the cell started holding', (e) => e.data === HOLDING);
  return { printed: seen.slice(0, -1), release: () => stream.abort() };
}
