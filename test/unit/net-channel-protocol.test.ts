/**
 * The host side of the network port against a scripted guest: a confused or hostile guest
 * loses its own connections, never hostd's memory or other sandboxes' service.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EgressGate } from '../../src/vm/channels/egress-gate.js';
import {
  NET_WINDOW,
  NetChannel,
  type NetChannelOptions,
} from '../../src/vm/channels/net-channel.js';
import { Kind, encodeFrame } from '../../src/vm/channels/port-frames.js';
import { connectUnix } from '../../testkit/guest-server.js';
import { ScriptedGuest } from '../helpers/scripted-guest.js';

const allowAll: EgressGate = {
  checkName: () => ({ allow: true }),
  checkAddresses: (_host, _port, addresses) => ({ allow: true, addresses }),
};

/** A resolver that never answers: connections stay in their opening phase. */
const neverResolves = (): Promise<string[]> => new Promise(() => undefined);

async function withScriptedGuest(
  fn: (guest: ScriptedGuest, channel: NetChannel) => Promise<void>,
  options: Partial<NetChannelOptions> = {},
): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hostd-net-proto-'));
  const guest = await ScriptedGuest.start(join(dir, 'net.sock'));
  let channel: NetChannel | undefined;
  try {
    channel = new NetChannel(await connectUnix(join(dir, 'net.sock')), {
      gate: allowAll,
      resolve: neverResolves,
      ...options,
    });
    const synced = channel.sync([5432]);
    const hello = await guest.next('hello');
    assert.deepEqual(hello.msg!.ports, [5432]);
    guest.send(guest.helloReply(hello.msg!.nonce));
    await synced;
    await fn(guest, channel);
  } finally {
    channel?.close();
    guest.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const open = (id: number, msg: Record<string, unknown> = {}): Buffer =>
  encodeFrame(Kind.open, id, Buffer.from(JSON.stringify(msg)));

test('a guest sending beyond its credit has that connection closed', async () => {
  await withScriptedGuest(async (guest, channel) => {
    guest.send(open(1, { port: 5432 }), open(2, { port: 5432 }));
    const piece = Buffer.alloc(32 * 1024);
    for (let sent = 0; sent <= NET_WINDOW; sent += piece.length) {
      guest.send(encodeFrame(Kind.data, 1, piece));
    }
    await guest.nextOfKind(Kind.close, 1);
    assert.equal(channel.stats.openConnections, 1, 'the other connection is untouched');
  });
});

test('connections beyond the limit are closed at once', async () => {
  await withScriptedGuest(
    async (guest, channel) => {
      guest.send(open(1), open(2), open(3));
      await guest.nextOfKind(Kind.close, 3);
      assert.equal(channel.stats.openConnections, 2);
    },
    { maxConnections: 2 },
  );
});

/** Refuses port 1 of host.hostd.internal: a refusal is a CLOSE the test can wait for. */
const refusesPortOne: EgressGate = {
  checkName: (_host, port) => (port === 1 ? { allow: false, reason: 'no' } : { allow: true }),
  checkAddresses: (_host, _port, addresses) => ({ allow: true, addresses }),
};

/** Frames are handled in order: once a refused connection's CLOSE is back, all before are. */
async function barrier(guest: ScriptedGuest, id: number): Promise<void> {
  guest.send(open(id, { port: 1 }));
  await guest.nextOfKind(Kind.close, id);
}

test('frames for connections hostd does not know are ignored', async () => {
  await withScriptedGuest(
    async (guest, channel) => {
      guest.send(
        encodeFrame(Kind.data, 77, Buffer.from('x')),
        encodeFrame(Kind.end, 78),
        encodeFrame(Kind.credit, 79, Buffer.alloc(4)),
        encodeFrame(Kind.close, 80),
        open(1, { port: 5432 }),
      );
      await barrier(guest, 2);
      assert.equal(channel.stats.openConnections, 1);
      assert.deepEqual(
        guest.frames.filter((f) => f.kind === Kind.close),
        [],
      );
    },
    { gate: refusesPortOne },
  );
});

test('garbage from the guest drops every connection and brings a new sync', async () => {
  await withScriptedGuest(
    async (guest, channel) => {
      guest.send(open(1, { port: 5432 }));
      guest.send(Buffer.from([0x99, 0, 0, 0, 1, 0, 0, 0, 0]));
      const hello = await guest.next('hello');
      assert.deepEqual(hello.msg!.ports, [5432], 'with the ports it had');
      assert.equal(channel.stats.openConnections, 0);
      guest.send(guest.helloReply(hello.msg!.nonce), open(3, { port: 5432 }));
      await barrier(guest, 4);
      assert.equal(channel.stats.openConnections, 1, 'the channel works again');
    },
    { gate: refusesPortOne },
  );
});

test('a port outside 1..65535 in an open frame is refused', async () => {
  await withScriptedGuest(async (guest) => {
    guest.send(open(1, { port: 70000 }));
    await guest.nextOfKind(Kind.close, 1);
  });
});
