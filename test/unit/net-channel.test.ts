/**
 * The network port end to end without a VM: the guest's relay (net_relay.py) runs locally,
 * its proxy on an ephemeral port and its host.hostd.internal listeners on 127.0.0.2; the
 * "internet" is servers on this machine's loopback, and names resolve through a test table.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer as createHttpServer, type IncomingHttpHeaders } from 'node:http';
import { type AddressInfo, connect, createServer, type Server, type Socket } from 'node:net';
import { egressGate, parseEgressRules } from '../../src/core/egress-policy.js';
import { NetChannel, type NetEvent, resolveWithDns } from '../../src/vm/channels/net-channel.js';
import { eventually } from '../../testkit/eventually.js';
import { GuestServer, connectUnix } from '../../testkit/guest-server.js';

const GUEST_INTERNAL_ADDRESS = '127.0.0.2';

const NAMES: Record<string, string[]> = {
  'allowed.test': ['127.0.0.1'],
  'other.test': ['127.0.0.1'],
};

async function resolveTest(host: string): Promise<string[]> {
  if (/^[\d.]+$/.test(host)) return [host];
  if (host === 'host.hostd.internal') return ['127.0.0.1'];
  const addresses = NAMES[host];
  if (!addresses) throw Object.assign(new Error('not found'), { code: 'ENOTFOUND' });
  return addresses;
}

interface World {
  guest: GuestServer;
  channel: NetChannel;
  proxyPort: number;
  events: NetEvent[];
}

/** A relay and a channel whose rules are `rules` ('127.0.0.1' plays the internet's address). */
async function withRelay(
  rules: string[],
  fn: (world: World) => Promise<void>,
  apiPort = 1,
): Promise<void> {
  const guest = await GuestServer.start('net_relay.py', [
    '--proxy-port',
    '0',
    '--internal-address',
    GUEST_INTERNAL_ADDRESS,
  ]);
  const events: NetEvent[] = [];
  const gate = egressGate(parseEgressRules(rules), { apiPort, hostAddresses: [] });
  let channel: NetChannel | undefined;
  try {
    channel = new NetChannel(await connectUnix(guest.socketPath), {
      gate,
      resolve: resolveTest,
      onEvent: (e) => events.push(e),
    });
    await fn({ guest, channel, proxyPort: guest.info.proxy_port as number, events });
  } finally {
    channel?.close();
    await guest.stop();
  }
}

async function listen(server: Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return (server.address() as AddressInfo).port;
}

/** A TCP server echoing what it gets. */
async function echoServer(): Promise<{ port: number; close: () => void }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
    socket.pipe(socket);
  });
  const port = await listen(server);
  return {
    port,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

interface Response {
  status: number;
  head: string;
  body: string;
}

/** Sends `raw` to the guest's proxy as a guest program would; reads until the close. */
async function viaProxy(proxyPort: number, raw: string | Buffer): Promise<Response> {
  const socket = connect(proxyPort, '127.0.0.1');
  socket.write(raw);
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  await Promise.race([once(socket, 'end'), once(socket, 'close')]);
  socket.destroy();
  const text = Buffer.concat(chunks).toString('latin1');
  const split = text.indexOf('\r\n\r\n');
  return {
    status: Number(/^HTTP\/1\.\d (\d{3})/.exec(text)?.[1] ?? 0),
    head: text.slice(0, split),
    body: text.slice(split + 4),
  };
}

/** Opens a CONNECT tunnel; resolves once the 200 arrived, with the socket. */
async function tunnel(proxyPort: number, target: string): Promise<Socket> {
  const socket = connect(proxyPort, '127.0.0.1');
  socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
  let got = Buffer.alloc(0);
  for (;;) {
    const [chunk] = (await once(socket, 'data')) as [Buffer];
    got = Buffer.concat([got, chunk]);
    const end = got.indexOf('\r\n\r\n');
    if (end < 0) continue;
    assert.equal(got.subarray(0, 12).toString(), 'HTTP/1.1 200', got.toString());
    if (end + 4 < got.length) socket.unshift(got.subarray(end + 4));
    return socket;
  }
}

async function readExactly(socket: Socket, n: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let got = 0;
  while (got < n) {
    const chunk = socket.read() as Buffer | null;
    if (chunk === null) {
      await once(socket, 'readable');
      continue;
    }
    chunks.push(chunk);
    got += chunk.length;
  }
  return Buffer.concat(chunks);
}

test('sync tells the relay which host ports to listen on', async () => {
  await withRelay(['host.hostd.internal:5432'], async ({ channel }) => {
    const result = await channel.sync([5432]);
    assert.deepEqual(result, { ports: [5432], failed: [], proxy: true });
  });
});

test('CONNECT to an allowed name tunnels bytes both ways, and they are counted', async () => {
  const echo = await echoServer();
  await withRelay(['allowed.test', '127.0.0.1'], async ({ channel, proxyPort, events }) => {
    await channel.sync([]);
    const socket = await tunnel(proxyPort, `allowed.test:${echo.port}`);
    socket.write('hello through the relay');
    assert.equal((await readExactly(socket, 23)).toString(), 'hello through the relay');
    socket.destroy();
    assert.deepEqual(events[0], {
      type: 'connected',
      host: 'allowed.test',
      port: echo.port,
      address: '127.0.0.1',
    });
    assert.equal(channel.stats.bytesOut, 23);
    assert.equal(channel.stats.bytesIn, 23);
  });
  echo.close();
});

test('a plain http:// request is forwarded in origin form with its Host from the URL', async () => {
  let seen: { url?: string; headers: IncomingHttpHeaders; body: string } | null = null;
  const origin = createHttpServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      seen = { url: req.url, headers: req.headers, body };
      res.end('from the origin');
    });
  });
  const port = await listen(origin as unknown as Server);
  await withRelay(['allowed.test', '127.0.0.1'], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    const response = await viaProxy(
      proxyPort,
      `POST http://allowed.test:${port}/path?q=1 HTTP/1.1\r\nHost: evil.test\r\n` +
        'Proxy-Connection: keep-alive\r\nContent-Length: 4\r\n\r\nbody',
    );
    assert.equal(response.status, 200);
    assert.equal(response.body, 'from the origin');
    assert.equal(seen!.url, '/path?q=1');
    assert.equal(seen!.headers.host, `allowed.test:${port}`);
    assert.equal(seen!.headers.connection, 'close');
    assert.equal(seen!.headers['proxy-connection'], undefined);
    assert.equal(seen!.body, 'body');
  });
  origin.close();
});

test('a refused request is answered 403 at once, naming the rules', async () => {
  await withRelay(
    ['allowed.test:443', '*.pythonhosted.org'],
    async ({ channel, proxyPort, events }) => {
      await channel.sync([]);
      const response = await viaProxy(proxyPort, 'CONNECT other.test:443 HTTP/1.1\r\n\r\n');
      assert.equal(response.status, 403);
      assert.ok(response.head.includes('X-Hostd-Egress: refused'));
      assert.ok(response.body.includes('allowed.test:443, *.pythonhosted.org'), response.body);
      assert.equal(events[0]?.type, 'refused');
    },
  );
});

test('a sandbox without network gets the no-network 403 for everything', async () => {
  await withRelay([], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    for (const raw of [
      'CONNECT allowed.test:443 HTTP/1.1\r\n\r\n',
      'GET http://allowed.test/ HTTP/1.1\r\n\r\n',
    ]) {
      const response = await viaProxy(proxyPort, raw);
      assert.equal(response.status, 403);
      assert.equal(
        response.body,
        'hostd: this sandbox has no network: create it with network.allow_out\n',
      );
    }
  });
});

test('a name allowed by its rule but resolving to loopback is refused', async () => {
  await withRelay(['allowed.test'], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    const response = await viaProxy(proxyPort, 'CONNECT allowed.test:443 HTTP/1.1\r\n\r\n');
    assert.equal(response.status, 403);
    assert.ok(response.body.includes('127.0.0.1, a loopback address'), response.body);
  });
});

test('a failed connect or lookup answers 502 with the reason', async () => {
  const closed = createServer();
  const port = await listen(closed);
  closed.close(); // nothing listens there any more
  await withRelay(['*.test', '127.0.0.1'], async ({ channel, proxyPort, events }) => {
    await channel.sync([]);
    const refused = await viaProxy(proxyPort, `CONNECT allowed.test:${port} HTTP/1.1\r\n\r\n`);
    assert.equal(refused.status, 502);
    assert.ok(refused.body.includes('ECONNREFUSED'), refused.body);
    assert.ok(refused.head.includes('X-Hostd-Egress: failed'));
    const unknown = await viaProxy(proxyPort, 'CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n');
    assert.equal(unknown.status, 502);
    assert.ok(unknown.body.includes('cannot resolve nowhere.test: ENOTFOUND'), unknown.body);
    assert.deepEqual(
      events.map((e) => e.type),
      ['failed', 'failed'],
    );
  });
});

test("hostd's API port is refused even when the rules name it", async () => {
  const api = await echoServer();
  await withRelay(
    ['127.0.0.1', `host.hostd.internal:${api.port}`],
    async ({ channel, proxyPort }) => {
      await channel.sync([]);
      for (const target of [`127.0.0.1:${api.port}`, `host.hostd.internal:${api.port}`]) {
        const response = await viaProxy(proxyPort, `CONNECT ${target} HTTP/1.1\r\n\r\n`);
        assert.equal(response.status, 403, target);
        assert.ok(response.body.includes("hostd's own API"), response.body);
      }
    },
    api.port,
  );
  api.close();
});

test('malformed proxy requests get 400', async () => {
  await withRelay(['*'], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    assert.equal(
      (await viaProxy(proxyPort, 'GET /not-a-proxy-request HTTP/1.1\r\n\r\n')).status,
      400,
    );
    assert.equal((await viaProxy(proxyPort, 'nonsense\r\n\r\n')).status, 400);
  });
});

test('host.hostd.internal:PORT reaches the host loopback, directly or through the proxy', async () => {
  const service = await echoServer();
  await withRelay([`host.hostd.internal:${service.port}`], async ({ channel, proxyPort }) => {
    assert.deepEqual((await channel.sync([service.port])).ports, [service.port]);
    const direct = connect(service.port, GUEST_INTERNAL_ADDRESS);
    await once(direct, 'connect');
    direct.write('direct');
    assert.equal((await readExactly(direct, 6)).toString(), 'direct');
    direct.destroy();
    const proxied = await tunnel(proxyPort, `host.hostd.internal:${service.port}`);
    proxied.write('proxied');
    assert.equal((await readExactly(proxied, 7)).toString(), 'proxied');
    proxied.destroy();
  });
  service.close();
});

test('a connection whose reader stalls does not hold up another', async () => {
  // The origin pours data into a client that never reads; the other client still gets through
  const firehose = createServer((socket) => {
    socket.on('error', () => undefined);
    const chunk = Buffer.alloc(64 * 1024, 120);
    const pour = (): void => {
      while (socket.write(chunk));
    };
    socket.on('drain', pour);
    pour();
  });
  const firehosePort = await listen(firehose);
  const echo = await echoServer();
  await withRelay(['allowed.test', '127.0.0.1'], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    const stalled = await tunnel(proxyPort, `allowed.test:${firehosePort}`);
    stalled.pause();
    // Every buffer on the way fills up, until hostd pauses the origin for want of credit
    await eventually(
      'the origin paused for want of credit',
      () => channel.stats.waitingOnGuest === 1,
    );
    const other = await tunnel(proxyPort, `allowed.test:${echo.port}`);
    other.write('still works');
    assert.equal((await readExactly(other, 11)).toString(), 'still works');
    other.destroy();
    stalled.destroy();
  });
  firehose.close();
  echo.close();
});

test('sync drops every open connection: after a restore they belong to another VM', async () => {
  const echo = await echoServer();
  await withRelay(['allowed.test', '127.0.0.1'], async ({ channel, proxyPort }) => {
    await channel.sync([]);
    const socket = await tunnel(proxyPort, `allowed.test:${echo.port}`);
    socket.on('error', () => undefined); // a reset, as the relay drops it
    const closed = new Promise((resolve) => socket.once('close', resolve));
    assert.equal(channel.stats.openConnections, 1);
    await channel.sync([]);
    await closed;
    assert.equal(channel.stats.openConnections, 0);
  });
  echo.close();
});

test('a quiet relay is taken as it is: no sync, and connections work at once', async () => {
  const echo = await echoServer();
  try {
    await withRelay(['allowed.test', '127.0.0.1'], async ({ channel, proxyPort }) => {
      const quiet = { ports: [], failed: [], proxy: true };
      assert.deepEqual(channel.acceptQuiet([], { ports: [] }), quiet);
      const socket = await tunnel(proxyPort, `allowed.test:${echo.port}`);
      socket.write('ping');
      assert.equal((await readExactly(socket, 4)).toString(), 'ping');
      socket.destroy();
      await eventually('no open connection', () => channel.stats.openConnections === 0);
      // The stream is in step: a sync afterwards starts over as it always does.
      assert.deepEqual(await channel.sync([]), quiet);
    });
  } finally {
    echo.close();
  }
});

test('a relay listening on other host ports than wanted gets a sync instead', async () => {
  await withRelay([], async ({ channel }) => {
    assert.equal(channel.acceptQuiet([8080], { ports: [] }), null);
    assert.equal(channel.acceptQuiet([], null), null);
    assert.deepEqual((await channel.sync([])).ports, []);
    // Once synced, the channel never takes the guest's word again.
    assert.equal(channel.acceptQuiet([], { ports: [] }), null);
  });
});

test('a relay that sent anything before its hello was read is synced, not taken as it is', async () => {
  const server = createServer();
  const port = await listen(server);
  const guestSide = new Promise<Socket>((resolve) => server.once('connection', resolve));
  const hostSide = connect(port, '127.0.0.1');
  await once(hostSide, 'connect');
  const channel = new NetChannel(hostSide, {
    gate: egressGate([], { apiPort: 1, hostAddresses: [] }),
  });
  const guest = await guestSide;
  try {
    guest.write(Buffer.from('a frame of the VM this one was copied from'));
    await once(hostSide, 'data'); // the channel's own listener ran first
    assert.equal(channel.acceptQuiet([], { ports: [] }), null);
  } finally {
    channel.close();
    guest.destroy();
    server.close();
  }
});

test('the default resolver: IP literals are themselves, host.hostd.internal the host loopback', async () => {
  assert.deepEqual(await resolveWithDns('203.0.113.7'), ['203.0.113.7']);
  assert.deepEqual(await resolveWithDns('2001:db8::7'), ['2001:db8::7']);
  assert.deepEqual(await resolveWithDns('host.hostd.internal'), ['127.0.0.1']);
});
