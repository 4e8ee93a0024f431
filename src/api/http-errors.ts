/**
 * The failures that happen before a route's handler runs (a URL the router cannot decode, a body
 * that does not parse, a request Node's HTTP parser refuses), each turned into a registry error,
 * so that every answer hostd gives is `{"error", "code"}` and none echoes a client's URL whole.
 */
import { maxHeaderSize, STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { fail, HostdError, toHostdError } from '../errors.js';

/** Deepest JSON a body may be: every request body of the API is at most three levels deep. */
export const MAX_JSON_DEPTH = 64;

/**
 * A JSON request body: undefined when empty; `bodyTooDeep` past MAX_JSON_DEPTH, checked on the
 * text before anything is built from it; `bodyNotJson` when it does not parse.
 */
export function parseJsonBody(raw: string): unknown {
  const text = raw.trim();
  if (text === '') return undefined;
  if (nestedDeeperThan(text, MAX_JSON_DEPTH)) throw fail('bodyTooDeep', MAX_JSON_DEPTH);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw fail('bodyNotJson', (err as Error).message);
  }
}

/** True when brackets outside strings nest more than `max` deep (a linear scan, no recursion). */
function nestedDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // a backslash escapes the next character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}

/**
 * The URL with every percent-escape of its path that does not decode (`%ff%fe`, a lone `%`)
 * escaped itself (`%25ff%25fe`), so that the router matches the route and the handler sees a
 * malformed id as such (`404 sandbox_not_found`, after authentication) instead of the router
 * rejecting the URL with its own answer. Valid escapes and the query string are left alone.
 */
export function escapeBadPercents(url: string): string {
  const q = url.indexOf('?');
  const path = q < 0 ? url : url.slice(0, q);
  if (!path.includes('%')) return url;
  const fixed = path.replace(/(?:%[0-9a-fA-F]{2})+|%/g, (run) => {
    try {
      decodeURIComponent(run);
      return run;
    } catch {
      return run.replaceAll('%', '%25'); // not UTF-8, or not an escape: the case at hand
    }
  });
  return q < 0 ? fixed : fixed + url.slice(q);
}

/** A failure fastify raised (a body parser's, the router's), as a registry error. */
export function classifyFrameworkError(
  err: { statusCode?: number; code?: string; message: string },
  maxBody: number,
  requestId: string,
): HostdError {
  if (err instanceof HostdError) return err;
  switch (err.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return fail('bodyTooLarge', null, maxBody);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return fail('unsupportedMediaType', 'application/json');
    // The router's: escapeBadPercents and maxParamLength leave these to URLs of another form.
    case 'FST_ERR_BAD_URL':
      return fail('malformedRequest', 'the URL is not valid');
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return fail('malformedRequest', 'a segment of the URL is too long');
  }
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500) {
    return fail('malformedRequest', err.message);
  }
  return toHostdError(err, requestId);
}

/**
 * Node's `clientError`: a request its HTTP parser refused (headers over 16 KiB, a URL that long,
 * bytes that are not HTTP, headers that did not arrive in time). No route runs, so the answer is
 * written on the socket, then the connection is closed, as Node itself does.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const answer =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? fail('requestTimeout')
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? fail('headersTooLarge', maxHeaderSize)
        : fail('malformedRequest', 'the bytes sent are not an HTTP/1.1 request');
  // A response already under way on this connection (pipelining) must not be cut into.
  const current = (socket as { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (socket.writable && !current?.headersSent) {
    const body = JSON.stringify(answer.toBody());
    socket.write(
      `HTTP/1.1 ${answer.status} ${STATUS_CODES[answer.status]}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
        `Connection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(err);
}
