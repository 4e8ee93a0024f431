/**
 * The files API (docs/api.md, Files) for tests and the bench: uploads of bytes, streams and tar
 * archives, downloads, listings, and hostd's resident memory while a transfer runs.
 */
import { readFile } from 'node:fs/promises';
import { Readable } from 'node:stream';
import type { Api } from './hostd.js';
import { assertNoHostDetails } from './host-details.js';

export interface FileEntry {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime_ms: number;
  target?: string | null;
}

const q = (path: string): string => `path=${encodeURIComponent(path)}`;

/** PUT the bytes (or a stream of them) to `path`; the answer's status and JSON body. */
export async function upload(
  api: Api,
  id: string,
  path: string,
  body: Uint8Array | string | Readable,
  opts: { tar?: boolean; mode?: string; contentLength?: number } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const headers: Record<string, string> = {
    ...api.headers,
    'content-type': opts.tar ? 'application/x-tar' : 'application/octet-stream',
  };
  if (opts.contentLength !== undefined) headers['content-length'] = String(opts.contentLength);
  const streamed = body instanceof Readable;
  const res = await fetch(
    `${api.url}/v1/sandboxes/${id}/files?${q(path)}${opts.mode ? `&mode=${opts.mode}` : ''}`,
    {
      method: 'PUT',
      headers,
      body: streamed ? (Readable.toWeb(body) as ReadableStream) : body,
      ...(streamed ? { duplex: 'half' } : {}),
    } as RequestInit,
  );
  const text = await res.text();
  if (res.status >= 300) assertNoHostDetails(`upload to ${path}`, text, api.hostDirs, [path]);
  return { status: res.status, body: JSON.parse(text) as Record<string, unknown> };
}

/** GET the file (or with `tar`, the directory as a tar stream) as a Response to read. */
export async function download(api: Api, id: string, path: string, tar = false): Promise<Response> {
  const res = await fetch(
    `${api.url}/v1/sandboxes/${id}/files?${q(path)}${tar ? '&format=tar' : ''}`,
    { headers: api.headers },
  );
  if (res.status >= 300) {
    const text = await res.clone().text();
    assertNoHostDetails(`download of ${path}`, text, api.hostDirs, [path]);
  }
  return res;
}

/** The file's bytes; throws with the error body when the answer is not 200. */
export async function readBytes(api: Api, id: string, path: string): Promise<Buffer> {
  const res = await download(api, id, path);
  if (res.status !== 200) throw new Error(`GET ${path}: ${res.status} ${await res.text()}`);
  return Buffer.from(await res.arrayBuffer());
}

export async function listDir(
  api: Api,
  id: string,
  path: string,
): Promise<{ status: number; body: { entries: FileEntry[]; code?: string } }> {
  return api.json('GET', `/v1/sandboxes/${id}/files/list?${q(path)}`);
}

export async function statPath(
  api: Api,
  id: string,
  path: string,
): Promise<{ status: number; body: FileEntry & { code?: string } }> {
  return api.json('GET', `/v1/sandboxes/${id}/files/stat?${q(path)}`);
}

export async function removePath(
  api: Api,
  id: string,
  path: string,
  recursive = false,
): Promise<{ status: number; code: string | undefined }> {
  const res = await api.request(
    'DELETE',
    `/v1/sandboxes/${id}/files?${q(path)}${recursive ? '&recursive=1' : ''}`,
  );
  const text = await res.text();
  return {
    status: res.status,
    code: text ? (JSON.parse(text) as { code?: string }).code : undefined,
  };
}

/** `n` bytes of zeros, produced as they are read: a large upload without a large buffer. */
export function zeros(n: number, chunk = 1024 * 1024): Readable {
  let left = n;
  const block = Buffer.alloc(chunk);
  return new Readable({
    read() {
      if (left <= 0) return void this.push(null);
      const size = Math.min(left, chunk);
      left -= size;
      this.push(size === chunk ? block : block.subarray(0, size));
    },
  });
}

/** A process's resident memory (VmRSS), in bytes. */
export async function rssBytes(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = /^VmRSS:\s+(\d+) kB/m.exec(status);
  return kb ? Number(kb[1]) * 1024 : 0;
}

/**
 * Runs `work` while sampling `pid`'s resident memory; returns its result and the most the
 * memory grew over what it was before. Sampling, not timing: no step waits on it.
 */
export async function peakRssGrowth<T>(
  pid: number,
  work: () => Promise<T>,
): Promise<{ result: T; growthBytes: number }> {
  const before = await rssBytes(pid);
  let peak = before;
  const timer = setInterval(() => {
    void rssBytes(pid).then((b) => (peak = Math.max(peak, b)));
  }, 20);
  try {
    const result = await work();
    peak = Math.max(peak, await rssBytes(pid));
    return { result, growthBytes: peak - before };
  } finally {
    clearInterval(timer);
  }
}
