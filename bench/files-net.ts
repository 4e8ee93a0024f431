/**
 * Issue 13's figures: the files API, rich outputs and network egress, through docs/api.md's
 * routes (skipped while hostd does not serve them).
 */
import { once } from 'node:events';
import { Agent, createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { sandboxQemuPid, type Api, type Hostd } from '../testkit/hostd.js';
import { createSandbox } from '../testkit/sandboxes.js';
import { expectOk, guarded, Skip } from './skip.js';
import { cpuMs, rssMib } from './proc-stats.js';
import { exec, httpRequest, now, pct, stdoutOf, type Results } from './util.js';

const MiB = 1024 * 1024;
/** Issue 13 names 256 MiB; a rate extrapolates, so the bench moves less to fit its 10 minutes. */
const TRANSFER_MIB = Number(process.env.BENCH_FILE_MIB ?? 64);

const filePath = (id: string, path: string): string =>
  `/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`;

/**
 * `poolFull` resolves once the pool has refilled after the sandbox's create: as for
 * `exec_print_p50_ms`, a refill restores a VM (hostd's and a new QEMU's CPU on the same two
 * cores), which is not the files path's cost (docs/architecture.md, "Where a small file
 * operation ...", session 12).
 */
export async function filesFigures(
  c: Api,
  hostd: Hostd | null,
  poolFull: () => Promise<void> = () => Promise.resolve(),
): Promise<Results> {
  const names = [
    'files_small_rw_p50_ms',
    'files_small_rw_fetch_p50_ms',
    'files_upload_mib_s',
    'files_download_mib_s',
    'files_transfer_hostd_rss_growth_mib',
  ];
  return guarded(names, async () => {
    const id = await createSandbox(c);
    try {
      await poolFull();
      const small = Buffer.alloc(4096, 0x61);
      // Through a keep-alive node:http client, as exec_print_p50_ms: the figure is hostd's and
      // the guest's. What a fetch() client sees is reported beside it (undici costs ~1 ms a
      // request here), the two clients alternating on the one sandbox; and the CPU of the
      // sandbox's QEMU and of hostd per keep-alive PUT+GET (docs/architecture.md, "Where a
      // small file operation ...").
      const keepAlive = new Agent({ keepAlive: true, maxSockets: 1 });
      const rw: number[] = [];
      const rwFetch: number[] = [];
      const qemuPid = hostd ? await sandboxQemuPid(hostd, id) : null;
      const cpu = { qemu: 0, hostd: 0 };
      const viaHttp = async (): Promise<void> => {
        const put = await httpRequest(c, keepAlive, 'PUT', filePath(id, '/tmp/small.bin'), small, {
          'content-type': 'application/octet-stream',
        });
        if (put.status !== 200) throw new Error(`PUT files: ${put.status}`);
        const got = await httpRequest(c, keepAlive, 'GET', filePath(id, '/tmp/small.bin'));
        if (got.status !== 200 || got.body.length !== small.length) {
          throw new Error(`GET files: ${got.status}, ${got.body.length} bytes`);
        }
      };
      const viaFetch = async (): Promise<void> => {
        await expectOk(
          await c.request('PUT', filePath(id, '/tmp/small.bin'), small, {
            'content-type': 'application/octet-stream',
          }),
          'PUT files',
        );
        const got = await expectOk(await c.request('GET', filePath(id, '/tmp/small.bin')), 'GET');
        if (got.length !== small.length) throw new Error(`read back ${got.length} bytes`);
      };
      for (let i = 0; i < 60; i++) {
        const http = i % 2 === 0;
        const before = [qemuPid, hostd?.proc.pid ?? null].map((p) => (p === null ? 0 : cpuMs(p)));
        const t = now();
        await (http ? viaHttp() : viaFetch());
        const ms = now() - t;
        if (!http) {
          rwFetch.push(ms);
          continue;
        }
        rw.push(ms);
        cpu.qemu += qemuPid === null ? 0 : cpuMs(qemuPid) - before[0]!;
        cpu.hostd += hostd ? cpuMs(hostd.proc.pid!) - before[1]! : 0;
      }
      keepAlive.destroy();
      // hostd's RSS is sampled during both transfers: streaming keeps it flat.
      const pid = hostd?.proc.pid;
      const rss0 = pid ? rssMib(pid) : 0;
      let rssMax = rss0;
      const sampler = setInterval(() => (rssMax = Math.max(rssMax, pid ? rssMib(pid) : 0)), 50);
      try {
        let t = now();
        await upload(c, id, '/tmp/big.bin', TRANSFER_MIB * MiB);
        const up = TRANSFER_MIB / ((now() - t) / 1000);
        t = now();
        const bytes = await download(c, id, '/tmp/big.bin');
        const down = bytes / MiB / ((now() - t) / 1000);
        if (bytes !== TRANSFER_MIB * MiB) throw new Error(`downloaded ${bytes} bytes`);
        return {
          files_small_rw_p50_ms: pct(rw, 50),
          files_small_rw_fetch_p50_ms: pct(rwFetch, 50),
          files_small_rw_qemu_cpu_ms:
            qemuPid === null ? null : Math.round((cpu.qemu / rw.length) * 100) / 100,
          files_small_rw_hostd_cpu_ms: hostd
            ? Math.round((cpu.hostd / rw.length) * 100) / 100
            : null,
          files_transfer_mib: TRANSFER_MIB,
          files_upload_mib_s: Math.round(up * 10) / 10,
          files_download_mib_s: Math.round(down * 10) / 10,
          files_transfer_hostd_rss_growth_mib: pid ? Math.round((rssMax - rss0) * 10) / 10 : null,
        };
      } finally {
        clearInterval(sampler);
      }
    } finally {
      await c.request('DELETE', `/v1/sandboxes/${id}`);
    }
  });
}

/** Streams `total` bytes from one reused buffer into file `path` of sandbox `id`. */
async function upload(c: Api, id: string, path: string, total: number): Promise<void> {
  const chunk = Buffer.alloc(MiB, 0x5a);
  let left = total;
  const body = new Readable({
    read() {
      const n = Math.min(chunk.length, left);
      left -= n;
      this.push(n ? chunk.subarray(0, n) : null);
    },
  });
  const req = request(new URL(c.url + filePath(id, path)), {
    method: 'PUT',
    headers: {
      ...c.headers,
      'content-type': 'application/octet-stream',
      'content-length': total,
    },
  });
  const answered = once(req, 'response') as Promise<[import('node:http').IncomingMessage]>;
  await pipeline(body, req);
  const [res] = await answered;
  let text = '';
  for await (const part of res) text += String(part);
  if (res.statusCode !== 200) throw new Error(`upload: ${res.statusCode} ${text.slice(0, 200)}`);
}

/** Reads file `path` of sandbox `id` to the end and returns its length. */
async function download(c: Api, id: string, path: string): Promise<number> {
  const res = await c.request('GET', filePath(id, path));
  if (!res.ok || !res.body) throw new Error(`download: ${res.status}`);
  let bytes = 0;
  for await (const part of res.body) bytes += (part as Uint8Array).length;
  return bytes;
}

const PLOT = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()';

/** A small matplotlib plot to a `display` event (`"display": true`), p50 of 10. */
export async function displayFigures(c: Api): Promise<Results> {
  return guarded(['display_png_p50_ms'], async () => {
    const id = await createSandbox(c);
    try {
      const times: number[] = [];
      for (let i = 0; i < 11; i++) {
        const t = now();
        const res = await c.request('POST', `/v1/sandboxes/${id}/exec`, {
          code: PLOT,
          display: true,
        });
        const text = await expectOk(res, 'exec with display');
        if (!text.includes('"type":"display"')) throw new Skip('no display event');
        if (i > 0) times.push(now() - t); // the first also imports matplotlib's backend
      }
      return { display_png_p50_ms: pct(times, 50) };
    } finally {
      await c.request('DELETE', `/v1/sandboxes/${id}`);
    }
  });
}

/**
 * A GET from the guest to an HTTP server on this machine's loopback, reached through the
 * allow-list as host.hostd.internal:PORT: p50 of 20, timed inside the guest.
 */
export async function egressFigures(c: Api): Promise<Results> {
  return guarded(['egress_http_get_p50_ms'], async () => {
    const server = createServer((_req, res) => res.end('ok'));
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const port = (server.address() as AddressInfo).port;
    let id: string | null = null;
    try {
      const created = await c.request('POST', '/v1/sandboxes', {
        network: { allow_out: [`host.hostd.internal:${port}`] },
      });
      id = (JSON.parse(await expectOk(created, 'create with network')) as { id: string }).id;
      const out = stdoutOf(
        await exec(
          c,
          id,
          [
            'import time, urllib.request, statistics',
            'ts = []',
            'try:',
            '    for _ in range(21):',
            '        t = time.perf_counter()',
            `        urllib.request.urlopen("http://host.hostd.internal:${port}/", timeout=10).read()`,
            '        ts.append((time.perf_counter() - t) * 1000)',
            '    print(statistics.median(ts[1:]))',
            'except OSError as e:',
            '    print("failed", type(e).__name__)',
          ].join('\n'),
        ),
      );
      // Until hostd wires the guest's network, the guest cannot reach the host at all.
      if (out.startsWith('failed')) throw new Skip(`the guest's GET ${out.trim()}`);
      return { egress_http_get_p50_ms: Math.round(Number(out.trim()) * 100) / 100 };
    } finally {
      if (id) await c.request('DELETE', `/v1/sandboxes/${id}`);
      server.close();
    }
  });
}
