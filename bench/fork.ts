/**
 * Fork figures: latency of a fork of n children (request sent until every child answers), the
 * host CPU each child's QEMU spent until then, and the memory of 32 idle children.
 */
import { findProcessesUsing } from '../src/state-dir.js';
import { sandboxQemuPid, type Api, type Hostd } from '../testkit/hostd.js';
import { forkStandbySettled, noExecRunning, poolHolds } from '../testkit/metrics.js';
import { createSandbox } from '../testkit/sandboxes.js';
import { cpuMs, pssMib, rssMib } from './proc-stats.js';
import { exec, now, pct, type Results } from './util.js';

const del = async (c: Api, id: string): Promise<void> => {
  await c.request('DELETE', `/v1/sandboxes/${id}`);
};

/**
 * Fork latency, p50 of five runs per size: the first run of each size finds fewer QEMUs started
 * ahead (as many as the last fork had children), so a median of three would rest on two.
 * `fork_child_cpu_ms` is user + system CPU of each child's QEMU (its start ahead included, as
 * it is work the host does per child) read as the fork answers: p50 over the n=8 and n=32 runs.
 */
export async function forkLatency(c: Api, hostd: Hostd | null): Promise<Results> {
  const results: Results = {};
  const id = await createSandbox(c);
  await exec(c, id, 'x = 1\nprint(x)');
  for (const n of [1, 8, 32]) {
    const times: number[] = [];
    const childCpu: number[] = [];
    for (let r = 0; r < 5; r++) {
      await forkStandbySettled(c);
      const t = now();
      const res = await c.request('POST', `/v1/sandboxes/${id}/fork`, { n });
      const body = (await res.json()) as { children?: { id: string }[]; error?: string };
      times.push(now() - t);
      if (!body.children) throw new Error(`fork ${n}: ${res.status} ${body.error}`);
      if (hostd) {
        for (const ch of body.children) childCpu.push(cpuMs(await sandboxQemuPid(hostd, ch.id)));
      }
      await Promise.all(body.children.map((ch) => del(c, ch.id)));
    }
    results[`fork_n${n}_ms`] = pct(times, 50);
    if (n > 1) results[`fork_n${n}_child_cpu_ms`] = hostd ? pct(childCpu, 50) : null;
  }
  results.fork_child_cpu_ms = results.fork_n8_child_cpu_ms ?? null;
  await del(c, id);
  return results;
}

/**
 * Memory of a 32-way fork of a parent that imported the standard library and holds a 50 MB
 * object: host PSS added per idle child, against what a full copy of the parent would cost.
 */
export async function forkMemory(c: Api, hostd: Hostd): Promise<Results> {
  const parent = await createSandbox(c);
  await exec(
    c,
    parent,
    [
      'import os, sys, json, re, collections, itertools, functools, asyncio, decimal, fractions',
      'import statistics, datetime, pathlib, subprocess, threading, socket, http.client, email, csv',
      'import sqlite3, xml.etree.ElementTree, unittest, argparse, logging, hashlib, random, typing',
      'blob = os.urandom(50 * 1024 * 1024)',
      'print(len(blob))',
    ].join('\n'),
  );
  // Measured on a host at rest: no exec running, the pool full, the fork standby started.
  const atRest = async (): Promise<void> => {
    await noExecRunning(c);
    await poolHolds(c, 'python', 4);
    await forkStandbySettled(c); // the standby QEMUs are counted before and after alike
  };
  await atRest();
  const qemuPss = async (): Promise<Map<number, number>> => {
    const m = new Map<number, number>();
    for (const pid of await findProcessesUsing(hostd.stateDir)) m.set(pid, pssMib(pid));
    return m;
  };
  const before = await qemuPss();
  const fullCopy = rssMib(await sandboxQemuPid(hostd, parent));
  const res = await c.request('POST', `/v1/sandboxes/${parent}/fork`, { n: 32 });
  const children = ((await res.json()) as { children: { id: string }[] }).children;
  // 32 live children run code at the same time.
  const outcomes = await Promise.allSettled(
    children.map((ch) =>
      exec(
        c,
        ch.id,
        'import hashlib\nprint(len(blob), hashlib.sha256(blob[:1000]).hexdigest()[:8])',
      ),
    ),
  );
  await atRest();
  const after = await qemuPss();
  const totalBefore = [...before.values()].reduce((a, b) => a + b, 0);
  const totalAfter = [...after.values()].reduce((a, b) => a + b, 0);
  const perChild = (totalAfter - totalBefore) / children.length;
  await Promise.all(children.map((ch) => del(c, ch.id)));
  await del(c, parent);
  return {
    fork_child_pss_mib: Math.round(perChild * 10) / 10,
    full_copy_child_mib: Math.round(fullCopy * 10) / 10,
    fork_n32_concurrent_exec_errors: outcomes.filter((o) => o.status === 'rejected').length,
  };
}
