/**
 * The HTTP proxy requests a guest's programs send to its egress proxy (net-channel.ts), and
 * the answers hostd gives when it does not relay them. Two forms: `CONNECT host:port` (HTTPS,
 * and anything tunnelled), and an absolute-form request (`GET http://host/path HTTP/1.1`),
 * which is forwarded in origin form with `Host` set from the URL (a different Host header
 * could reach another site behind the same address) and `Connection: close` (so that the
 * next request, maybe to another host, comes on a new connection and is judged again).
 */
import { isIPv6 } from 'node:net';

/** Longer request heads are refused (431); below the relay's window, so it always arrives. */
export const MAX_HEAD_BYTES = 32 * 1024;

/** What the guest's client asked for, or why hostd cannot relay it (answered with `status`). */
export type ProxyRequest =
  | {
      readonly kind: 'connect';
      readonly host: string;
      readonly port: number;
      /** Bytes the client sent after the head (a TLS hello sent early). */
      readonly rest: Buffer;
    }
  | {
      readonly kind: 'forward';
      readonly host: string;
      readonly port: number;
      /** The request head to send to the origin server. */
      readonly head: Buffer;
      /** The body bytes that followed the head. */
      readonly rest: Buffer;
    }
  | { readonly kind: 'invalid'; readonly status: 400 | 431 | 505; readonly reason: string };

/** Parses the request head at the start of `buffer`; null until the whole head is there. */
export function parseProxyRequest(buffer: Buffer): ProxyRequest | null {
  const end = headEnd(buffer);
  if (end === null) {
    return buffer.length >= MAX_HEAD_BYTES
      ? invalid(431, `request head longer than ${MAX_HEAD_BYTES} bytes`)
      : null;
  }
  if (end.headLength > MAX_HEAD_BYTES) {
    return invalid(431, `request head longer than ${MAX_HEAD_BYTES} bytes`);
  }
  const lines = buffer.subarray(0, end.headLength).toString('latin1').split(/\r?\n/);
  const rest = buffer.subarray(end.bodyStart);
  const match = /^([A-Za-z]+) (\S+) HTTP\/(\d\.\d)$/.exec(lines[0] ?? '');
  if (!match) return invalid(400, 'malformed request line');
  const [, method, target, version] = match as unknown as [string, string, string, string];
  if (version !== '1.1' && version !== '1.0') return invalid(505, `HTTP/${version}`);
  if (method.toUpperCase() === 'CONNECT') {
    const authority = parseAuthority(target, null);
    if (typeof authority === 'string') return invalid(400, authority);
    return { kind: 'connect', host: authority.host, port: authority.port, rest };
  }
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(target)?.[1]?.toLowerCase();
  if (scheme === 'https') return invalid(400, 'https:// URLs go through CONNECT');
  if (scheme !== 'http') {
    return invalid(400, 'this is a proxy: send CONNECT host:port or an absolute http:// URL');
  }
  const afterScheme = target.slice('http://'.length);
  const pathStart = afterScheme.search(/[/?#]/);
  const authorityText = pathStart < 0 ? afterScheme : afterScheme.slice(0, pathStart);
  const authority = parseAuthority(authorityText, 80);
  if (typeof authority === 'string') return invalid(400, authority);
  let path = pathStart < 0 ? '/' : afterScheme.slice(pathStart).split('#')[0]!;
  if (!path.startsWith('/')) path = `/${path}`;
  const headers = forwardedHeaders(lines.slice(1), authorityText);
  if (typeof headers === 'string') return invalid(400, headers);
  const head = `${method} ${path} HTTP/${version}\r\n${headers.join('\r\n')}\r\n\r\n`;
  return {
    kind: 'forward',
    host: authority.host,
    port: authority.port,
    head: Buffer.from(head, 'latin1'),
    rest,
  };
}

function headEnd(buffer: Buffer): { headLength: number; bodyStart: number } | null {
  const limit = buffer.subarray(0, MAX_HEAD_BYTES + 4);
  const crlf = limit.indexOf('\r\n\r\n');
  const lf = limit.indexOf('\n\n');
  if (crlf >= 0 && (lf < 0 || crlf < lf)) return { headLength: crlf, bodyStart: crlf + 4 };
  if (lf >= 0) return { headLength: lf, bodyStart: lf + 2 };
  return null;
}

/** `host:port`, `[v6]:port`, or without the port when it has a default. */
function parseAuthority(
  text: string,
  defaultPort: number | null,
): { host: string; port: number } | string {
  if (text.includes('@')) return 'credentials in the URL are not forwarded';
  let host: string;
  let portText: string | undefined;
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    host = close < 0 ? '' : text.slice(1, close);
    if (!isIPv6(host) || host.includes('%')) return `invalid IPv6 address in ${text}`;
    const after = text.slice(close + 1);
    if (after && !after.startsWith(':')) return `invalid authority ${text}`;
    portText = after ? after.slice(1) : undefined;
  } else {
    const colon = text.lastIndexOf(':');
    host = colon < 0 ? text : text.slice(0, colon);
    portText = colon < 0 ? undefined : text.slice(colon + 1);
    if (!/^[A-Za-z0-9._-]+$/.test(host)) return `invalid host in ${JSON.stringify(text)}`;
  }
  if (portText === undefined) {
    if (defaultPort === null) return 'CONNECT needs host:port';
    return { host: host.toLowerCase(), port: defaultPort };
  }
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : 0;
  if (port < 1 || port > 65535) return `invalid port in ${JSON.stringify(text)}`;
  return { host: host.toLowerCase(), port };
}

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'proxy-authenticate',
  'te',
  'trailer',
  'upgrade',
  'host',
]);

/** The request's headers as the origin server gets them; or why they are malformed. */
function forwardedHeaders(lines: string[], authority: string): string[] | string {
  const parsed: [string, string][] = [];
  for (const line of lines) {
    if (line === '') continue;
    const colon = line.indexOf(':');
    const name = colon > 0 ? line.slice(0, colon) : '';
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) return 'malformed header line';
    parsed.push([name, line.slice(colon + 1).trim()]);
  }
  // Headers the client's Connection header names are hop-by-hop too
  const named = new Set(
    parsed
      .filter(([name]) => name.toLowerCase() === 'connection')
      .flatMap(([, value]) => value.split(',').map((v) => v.trim().toLowerCase())),
  );
  const kept = parsed
    .filter(([name]) => !HOP_BY_HOP.has(name.toLowerCase()) && !named.has(name.toLowerCase()))
    .map(([name, value]) => `${name}: ${value}`);
  return [`Host: ${authority}`, ...kept, 'Connection: close'];
}

function invalid(status: 400 | 431 | 505, reason: string): ProxyRequest {
  return { kind: 'invalid', status, reason };
}

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  403: 'Forbidden',
  431: 'Request Header Fields Too Large',
  502: 'Bad Gateway',
  505: 'HTTP Version Not Supported',
};

/**
 * The whole answer hostd gives instead of relaying: a short text body that says why, and
 * `X-Hostd-Egress` so that a program (or a test) can tell it from the origin's own answer.
 */
export function proxyAnswer(status: number, reason: string): Buffer {
  // One frame to the guest (at most 32 KiB), whatever the rules list holds
  const text = reason.length > 4000 ? `${reason.slice(0, 4000)}...` : reason;
  const body = Buffer.from(`hostd: ${text}\n`, 'utf8');
  return Buffer.concat([
    Buffer.from(
      `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}\r\n` +
        'Content-Type: text/plain; charset=utf-8\r\n' +
        `Content-Length: ${body.length}\r\n` +
        `X-Hostd-Egress: ${status === 403 ? 'refused' : 'failed'}\r\n` +
        'Connection: close\r\n\r\n',
      'latin1',
    ),
    body,
  ]);
}

/** The answer to a CONNECT, sent once the remote connection is open (not before). */
export const CONNECT_ESTABLISHED = Buffer.from('HTTP/1.1 200 Connection established\r\n\r\n');
