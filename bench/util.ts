/** Small helpers every part of the bench shares: percentiles, clocks, exec round trips. */
import { request, type Agent } from 'node:http';
import type { Api } from '../testkit/hostd.js';

export type Results = Record<string, number | string | null>;

export function pct(values: number[], p: number): number {
  const s = [...values].sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return Math.round(s[i]! * 100) / 100;
}

export const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/** Runs `code` in sandbox `id` through fetch and returns the NDJSON stream's text. */
export async function exec(c: Api, id: string, code: string): Promise<string> {
  const res = await c.request('POST', `/v1/sandboxes/${id}/exec`, { code });
  const text = await res.text();
  checkExec(id, res.status, text);
  return text;
}

/** Throws unless an exec's response is a 200 stream ending in exit 0. */
export function checkExec(id: string, status: number | undefined, text: string): void {
  if (status !== 200 || !text.includes('"type":"exit","data":0')) {
    throw new Error(`exec on ${id}: ${status} ${text.slice(0, 300)}`);
  }
}

/**
 * `exec` through a node:http agent (keep-alive) instead of fetch, which costs ~1 ms itself;
 * `extra` adds fields to the request (a `timeout`, so that a sample cannot hang the run).
 */
export async function execHttp(
  c: Api,
  agent: Agent,
  id: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<void> {
  const body = Buffer.from(JSON.stringify({ code, ...extra }));
  const res = await httpRequest(c, agent, 'POST', `/v1/sandboxes/${id}/exec`, body, {
    'content-type': 'application/json',
  });
  checkExec(id, res.status, res.body.toString('utf8'));
}

/** The text a cell printed on stdout, from an exec's NDJSON stream. */
export function stdoutOf(ndjson: string): string {
  return ndjson
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { type: string; data: unknown })
    .filter((e) => e.type === 'stdout')
    .map((e) => String(e.data))
    .join('');
}

/**
 * One request through a node:http agent (keep-alive): its status and whole body, without fetch's
 * own ~1 ms. The exec, create and files figures all send through it.
 */
export function httpRequest(
  c: Api,
  agent: Agent,
  method: string,
  path: string,
  body?: Buffer,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = request(
      new URL(c.url + path),
      {
        method,
        agent,
        headers: {
          ...c.headers,
          ...headers,
          ...(body ? { 'content-length': String(body.length) } : {}),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * Creates a sandbox (`POST /v1/sandboxes` with `body`) through a node:http keep-alive agent, as
 * the TypeScript SDK does (sdk/typescript/src/transport.ts), and returns its id. fetch (undici),
 * which testkit's `createSandbox` uses, added 0.3 to 0.5 ms to a pool hit's round trip here.
 */
export async function createHttp(c: Api, agent: Agent, body: unknown = {}): Promise<string> {
  const text = Buffer.from(JSON.stringify(body));
  const res = await httpRequest(c, agent, 'POST', '/v1/sandboxes', text, {
    'content-type': 'application/json',
  });
  const answer = res.body.toString('utf8');
  if (res.status !== 200) throw new Error(`create returned ${res.status}: ${answer.slice(0, 300)}`);
  return (JSON.parse(answer) as { id: string }).id;
}
