/**
 * `node dist/bench/channels.js`: the files and network channels measured without a VM, with
 * the guest side (files_server.py, net_relay.py) running locally on this machine. A VM under
 * TCG runs the guest side 5 to 10 times slower; these figures are the channels' own cost.
 * Files go to /dev/shm, a tmpfs like the guest's root filesystem. Prints JSON.
 *
 * BENCH_QUICK=1 runs smaller transfers.
 */
import { once } from 'node:events';
import { readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { join } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { egressGate, parseEgressRules } from '../src/core/egress-policy.js';
import { FileChannel } from '../src/vm/channels/file-channel.js';
import { NetChannel } from '../src/vm/channels/net-channel.js';
import { GuestServer, connectUnix } from '../testkit/guest-server.js';

const QUICK = process.env.BENCH_QUICK === '1';
const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const now = (): number => performance.now();

function pct(values: number[], p: number): number {
  const s = [...values].sort((a, b) => a - b);
  return Math.round(s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]! * 1000) / 1000;
}

/** `total` bytes from one reused 64 KiB buffer: the producer costs nothing. */
function source(total: number): Readable {
  const chunk = Buffer.alloc(64 * 1024, 0x5a);
  let left = total;
  return new Readable({
    highWaterMark: 64 * 1024,
    read() {
      const n = Math.min(chunk.length, left);
      left -= n;
      this.push(n ? chunk.subarray(0, n) : null);
    },
  });
}

function sink(): Writable & { bytes: number } {
  const w = new Writable({
    highWaterMark: 64 * 1024,
    write(chunk: Buffer, _enc, cb) {
      w.bytes += chunk.length;
      cb();
    },
  }) as Writable & { bytes: number };
  w.bytes = 0;
  return w;
}

/** CPU seconds (user + system) of this process and of process `pid`. */
function cpuSeconds(pid: number): [number, number] {
  const own = process.cpuUsage();
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return [(own.user + own.system) / 1e6, (Number(fields[11]) + Number(fields[12])) / 100];
}

function vmHwmKiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0);
}

/** Runs fn while sampling this process's RSS; returns fn's result and the RSS growth. */
async function rssGrowth<T>(fn: () => Promise<T>): Promise<[T, number]> {
  global.gc?.();
  const base = process.memoryUsage().rss;
  let peak = base;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
  try {
    const result = await fn();
    peak = Math.max(peak, process.memoryUsage().rss);
    return [result, Math.round(((peak - base) / MiB) * 10) / 10];
  } finally {
    clearInterval(timer);
  }
}

async function files(results: Record<string, number>): Promise<void> {
  const guest = await GuestServer.start('files_server.py');
  const dir = `/dev/shm/hostd-bench-${process.pid}`;
  let channel: FileChannel | undefined;
  try {
    const files = (channel = new FileChannel(await connectUnix(guest.socketPath)));
    await files.mkdir(dir);
    const small = Buffer.alloc(4096, 1);
    const times: number[] = [];
    const pid = guest.info.pid as number;
    const before = cpuSeconds(pid);
    for (let i = 0; i < (QUICK ? 50 : 500); i++) {
      const t0 = now();
      await files.putFile(join(dir, 'small'), small);
      const download = await files.readFile(join(dir, 'small'));
      await pipeline(download.stream, sink());
      await download.done;
      times.push(now() - t0);
    }
    results.files_4k_write_read_p50_ms = pct(times, 50);
    results.files_4k_write_read_p90_ms = pct(times, 90);
    // CPU per write+read on each side: what a loaded host cannot inflate (its waits can)
    const used = cpuSeconds(pid).map((v, i) => ((v - before[i]!) * 1e6) / times.length);
    results.files_4k_write_read_host_cpu_us = Math.round(used[0]!);
    results.files_4k_write_read_guest_cpu_us = Math.round(used[1]!);

    // Wall-clock rates depend on what else runs on the machine (a busy host delays every
    // hand-over between the two processes); the CPU seconds each side spends do not (they run
    // in parallel, so the busier one bounds the rate). Best of three runs.
    const size = (QUICK ? 32 : 256) * MiB;
    const transfer = async (direction: 'upload' | 'download'): Promise<void> => {
      let best = 0;
      for (let run = 0; run < 3; run++) {
        const cpu = cpuSeconds(pid);
        const t0 = now();
        if (direction === 'upload') {
          const upload = files.writeFile(join(dir, 'big'));
          await pipeline(source(size), upload.sink);
          await upload.done;
        } else {
          const download = await files.readFile(join(dir, 'big'));
          await pipeline(download.stream, sink());
          await download.done;
        }
        const rate = Math.round(size / MiB / ((now() - t0) / 1000));
        if (rate <= best) continue;
        best = rate;
        const spent = cpuSeconds(pid).map((v, i) => v - cpu[i]!);
        results[`files_${direction}_mib_s`] = rate;
        results[`files_${direction}_host_cpu_s_per_gib`] =
          Math.round((spent[0]! * GiB * 100) / size) / 100;
        results[`files_${direction}_guest_cpu_s_per_gib`] =
          Math.round((spent[1]! * GiB * 100) / size) / 100;
      }
    };
    await transfer('upload');
    await transfer('download');

    const huge = (QUICK ? 64 : 1024) * MiB;
    const [, upGrowth] = await rssGrowth(async () => {
      const up = files.writeFile(join(dir, 'huge'));
      await pipeline(source(huge), up.sink);
      await up.done;
    });
    const [, downGrowth] = await rssGrowth(async () => {
      const down = await files.readFile(join(dir, 'huge'));
      await pipeline(down.stream, sink());
      await down.done;
    });
    results[`files_${huge / MiB}mib_upload_host_rss_growth_mib`] = upGrowth;
    results[`files_${huge / MiB}mib_download_host_rss_growth_mib`] = downGrowth;
    results.files_guest_peak_rss_mib = Math.round(vmHwmKiB(guest.info.pid as number) / 1024);
  } finally {
    channel?.close();
    await guest.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function network(results: Record<string, number>): Promise<void> {
  const origin = createServer((_req, res) => res.end('ok'));
  origin.listen(0, '127.0.0.1');
  await once(origin, 'listening');
  const port = (origin.address() as AddressInfo).port;
  const guest = await GuestServer.start('net_relay.py', ['--proxy-port', '0']);
  const gate = egressGate(parseEgressRules(['origin.test', '127.0.0.1']), {
    apiPort: 7070,
    hostAddresses: [],
  });
  let channel: NetChannel | undefined;
  try {
    channel = new NetChannel(await connectUnix(guest.socketPath), {
      gate,
      resolve: (host) => Promise.resolve(host === 'origin.test' ? ['127.0.0.1'] : [host]),
    });
    await channel.sync([]);
    const proxyPort = guest.info.proxy_port as number;
    const times: number[] = [];
    for (let i = 0; i < (QUICK ? 50 : 300); i++) {
      const t0 = now();
      const socket = connect(proxyPort, '127.0.0.1');
      socket.write(`GET http://origin.test:${port}/ HTTP/1.1\r\nUser-Agent: bench\r\n\r\n`);
      socket.resume();
      await once(socket, 'end');
      socket.destroy();
      times.push(now() - t0);
    }
    results.net_small_get_p50_ms = pct(times, 50);
    results.net_small_get_p90_ms = pct(times, 90);
  } finally {
    channel?.close();
    await guest.stop();
    origin.close();
  }
}

const results: Record<string, number> = {};
await files(results);
await network(results);
console.log(JSON.stringify(results, null, 2));
