/**
 * The etcd adapter of cluster mode (src/cluster/etcd-kv.ts) against a real etcd (Debian's
 * etcd-server, one member on loopback): compare-and-set on revisions, keys on a lease gone with
 * it, an ordered watch, and calls that fail within their bound when etcd is unreachable. The
 * catalog logic above it is unit-tested on the in-memory store with the same contract.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { EtcdKv } from '../../src/cluster/etcd-kv.js';
import type { KvEvent } from '../../src/core/cluster/kv.js';
import { sharedSecret, sharedSecretKey } from '../../src/core/cluster/shared-secret.js';
import { eventually } from '../../testkit/eventually.js';
import { startEtcd, type EtcdMember } from '../../testkit/cluster.js';

describe('etcd adapter', () => {
  let work: string;
  let members: EtcdMember[];
  let kv: EtcdKv;
  before(async () => {
    work = await mkdtemp('/var/tmp/hostd-test-etcd-');
    members = await startEtcd(work, 1);
    kv = new EtcdKv({ endpoints: [members[0]!.clientUrl], callTimeoutMs: 2000 });
  });
  after(async () => {
    await kv?.close();
    await Promise.all((members ?? []).map((m) => m.stop()));
    await rm(work, { recursive: true, force: true });
  });

  test('a transaction applies only when every compared revision holds', async () => {
    const created = await kv.txn(
      [{ key: 'sandboxes/a', modRevision: 0 }],
      [{ put: 'sandboxes/a', value: '{"n":1}' }],
    );
    assert.equal(created.succeeded, true);
    const again = await kv.txn(
      [{ key: 'sandboxes/a', modRevision: 0 }],
      [{ put: 'sandboxes/a', value: '{"n":2}' }],
    );
    assert.equal(again.succeeded, false);
    const read = await kv.get('sandboxes/a');
    assert.equal(read?.value, '{"n":1}');
    assert.equal(read?.modRevision, created.revision);
    const update = await kv.txn(
      [{ key: 'sandboxes/a', modRevision: created.revision }],
      [{ put: 'sandboxes/a', value: '{"n":3}' }, { delete: 'sandboxes/none' }],
    );
    assert.equal(update.succeeded, true);
    const { entries } = await kv.list('sandboxes/');
    assert.deepEqual(
      entries.map((e) => [e.key, e.value]),
      [['sandboxes/a', '{"n":3}']],
    );
  });

  test("the cluster's shared secret is made once, whichever clients ask at the same time", async () => {
    const other = new EtcdKv({ endpoints: [members[0]!.clientUrl], callTimeoutMs: 2000 });
    try {
      const [one, two] = await Promise.all([
        sharedSecret(kv, 'test-secret'),
        sharedSecret(other, 'test-secret'),
      ]);
      assert.equal(one.length, 32);
      assert.deepEqual(two, one);
      assert.deepEqual(await sharedSecret(kv, 'test-secret'), one);
      assert.equal((await kv.list(sharedSecretKey(''))).entries.length, 1);
    } finally {
      await other.close();
    }
  });

  test('keys written on the lease go when it is revoked; the watch sees it all in order', async () => {
    const { revision } = await kv.list('');
    const events: KvEvent[] = [];
    const stop = kv.watch('live/', revision, {
      event: (e) => events.push(e),
      reset: () => undefined,
      connection: () => undefined,
    });
    try {
      await kv.grantLease(5, () => undefined);
      await kv.txn([], [{ put: 'live/a', value: 'n1', lease: true }]);
      await kv.revokeLease();
      await eventually('both events', () => events.length === 2, { timeoutMs: 10_000 });
      assert.deepEqual(
        events.map((e) => [e.type, e.key]),
        [
          ['put', 'live/a'],
          ['delete', 'live/a'],
        ],
      );
      assert.equal(await kv.get('live/a'), null);
    } finally {
      stop();
    }
  });

  test('with etcd unreachable, calls fail within their bound', async () => {
    await members[0]!.stop();
    try {
      const started = Date.now();
      await assert.rejects(kv.get('sandboxes/a'));
      assert.ok(Date.now() - started < 10_000);
    } finally {
      await members[0]!.start();
    }
    await eventually(
      'etcd back',
      async () => (await kv.get('sandboxes/a').catch(() => null)) !== null,
      {
        timeoutMs: 30_000,
        everyMs: 200,
      },
    );
  });
});
