/**
 * Turns the body of an exec response into events: split into NDJSON lines as bytes arrive,
 * put in `seq` order, and checked for the in-stream failure report. Any way the stream can go
 * wrong after its 200 (a broken connection, a malformed line, no `exit` event, an `exit` with
 * `error`) becomes an ExecutorError; silence past the stream's timeout is RequestTimeoutError.
 */
import type { IncomingMessage } from 'node:http';
import { ExecutorError, RequestTimeoutError } from './errors.js';
import { describe } from './transport.js';
import type { ExecEvent, ExitEvent } from './types.js';

/** Yields each complete line of the body as soon as its newline arrives. */
export async function* ndjsonLines(
  body: IncomingMessage,
  signal?: AbortSignal,
): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffered = '';
  let done = false;
  const chunks = body[Symbol.asyncIterator]();
  try {
    for (;;) {
      let chunk: IteratorResult<Buffer>;
      try {
        chunk = (await chunks.next()) as IteratorResult<Buffer>;
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        if (err instanceof RequestTimeoutError) throw err;
        throw new ExecutorError(`the exec stream broke: ${describe(err)}`, { cause: err });
      }
      if (chunk.done) break;
      buffered += decoder.decode(chunk.value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf('\n')) !== -1) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.trim() !== '') yield line;
      }
    }
    done = true;
    buffered += decoder.decode();
    if (buffered.trim() !== '') yield buffered;
  } finally {
    // Leaving early (break, an exception, abort) closes the connection, which tells hostd to
    // interrupt the code so that the sandbox's queue moves on.
    if (!done) body.destroy();
  }
}

/**
 * Parses one line; anything malformed is an ExecutorError. `event` is undefined for an event
 * type this SDK does not know (a newer server): it keeps its place in the order and is skipped.
 */
export function parseEvent(line: string): { seq: number; event: ExecEvent | undefined } {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    throw new ExecutorError(`hostd sent an exec line that is not JSON: ${line.slice(0, 200)}`);
  }
  const e = value as Partial<Record<keyof ExitEvent, unknown>> | null;
  if (typeof e !== 'object' || e === null || typeof e.seq !== 'number') {
    throw new ExecutorError(`hostd sent a malformed exec event: ${line.slice(0, 200)}`);
  }
  const seq = e.seq;
  if ((e.type === 'stdout' || e.type === 'stderr') && typeof e.data === 'string') {
    return { seq, event: value as ExecEvent };
  }
  if (e.type === 'exit' && typeof e.data === 'number') return { seq, event: value as ExitEvent };
  if ((e.type === 'display' || e.type === 'result') && isBundle(e.data)) {
    return { seq, event: value as ExecEvent };
  }
  if (e.type === 'execution_count' && typeof e.data === 'number') {
    return { seq, event: value as ExecEvent };
  }
  if (e.type === 'error' && isCellError(e.data)) return { seq, event: value as ExecEvent };
  if (
    typeof e.type === 'string' &&
    ['stdout', 'stderr', 'exit', 'display', 'result', 'execution_count', 'error'].includes(e.type)
  ) {
    throw new ExecutorError(`hostd sent a malformed exec event: ${line.slice(0, 200)}`);
  }
  return { seq, event: undefined };
}

function isBundle(data: unknown): boolean {
  return typeof data === 'object' && data !== null && !Array.isArray(data);
}

function isCellError(data: unknown): boolean {
  if (!isBundle(data)) return false;
  const { name, value, traceback } = data as Record<string, unknown>;
  return typeof name === 'string' && typeof value === 'string' && typeof traceback === 'string';
}

/**
 * Yields events in `seq` order starting at 0, holding back any that arrive early; what is still
 * held when the stream ends (a gap that never filled) is released in `seq` order.
 */
export async function* inSeqOrder(
  events: AsyncIterable<{ seq: number; event: ExecEvent | undefined }>,
): AsyncGenerator<ExecEvent> {
  const early = new Map<number, ExecEvent | undefined>();
  let next = 0;
  for await (const { seq, event } of events) {
    if (seq < next || early.has(seq)) continue; // a duplicate
    early.set(seq, event);
    while (early.has(next)) {
      const ready = early.get(next);
      early.delete(next);
      next += 1;
      if (ready) yield ready;
    }
  }
  for (const seq of [...early.keys()].sort((a, b) => a - b)) {
    const event = early.get(seq);
    if (event) yield event;
  }
}

/**
 * The events of one exec response body, in order, ending after the `exit` event. Raises
 * ExecutorError for an `exit` carrying `error` and for a stream with no `exit` at all.
 */
export async function* execEvents(
  body: IncomingMessage,
  signal?: AbortSignal,
): AsyncGenerator<ExecEvent> {
  async function* parsed(): AsyncGenerator<{ seq: number; event: ExecEvent | undefined }> {
    for await (const line of ndjsonLines(body, signal)) yield parseEvent(line);
  }
  for await (const event of inSeqOrder(parsed())) {
    if (event.type !== 'exit') {
      yield event;
      continue;
    }
    if (event.error !== undefined) {
      throw new ExecutorError(event.error || 'the exec failed in the sandbox', { event });
    }
    yield event;
    return;
  }
  throw new ExecutorError('the exec stream ended without an exit event');
}
