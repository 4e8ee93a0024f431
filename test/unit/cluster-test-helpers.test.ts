/**
 * The cluster test helpers themselves (test/helpers/cluster-server.ts): a node whose start
 * fails midway leaves nothing behind, and stopping nodes stops every one even when one fails.
 * A server left listening keeps the test file's process alive: `npm run test:unit` would hang
 * on the failure instead of reporting it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pino } from 'pino';
import { startServedNode, stopServedNodes, type ServedNode } from '../helpers/cluster-server.js';
import { MemoryStore } from '../helpers/memory-kv.js';

const log = pino({ level: 'silent' });
const options = { apiKey: 'k', clusterKey: 'c', log, copies: false };

const listening = (url: string): Promise<boolean> =>
  fetch(`${url}/v1/cluster`).then(
    () => true,
    () => false,
  );

test('a served node whose start fails after it listens closes its server', async () => {
  let made: ServedNode | undefined;
  await assert.rejects(
    startServedNode(new MemoryStore(), 'a', {
      ...options,
      beforeStart: (node) => {
        made = node;
        return Promise.reject(new Error('the start fails here'));
      },
    }),
    /the start fails here/,
  );
  try {
    assert.ok(made);
    assert.equal(await listening(made.url), false);
  } finally {
    await stopServedNodes(made);
  }
});

test('stopping nodes stops each one though an earlier one fails to stop', async () => {
  const store = new MemoryStore();
  const a = await startServedNode(store, 'a', options);
  const b = await startServedNode(store, 'b', options);
  const shutdown = a.manager.shutdown.bind(a.manager);
  a.manager.shutdown = () => Promise.reject(new Error('a fails to stop'));
  try {
    await assert.rejects(stopServedNodes(a, b), /a fails to stop/);
    assert.equal(await listening(b.url), false);
    assert.equal(await listening(a.url), false);
  } finally {
    a.manager.shutdown = shutdown;
    await a.manager.shutdown();
    // Without the helper's care, what it left: closing twice is harmless.
    for (const n of [a, b]) {
      await n.manager.shutdown();
      await n.cluster.stop();
      n.peers.close();
      await n.app.close();
    }
  }
});
