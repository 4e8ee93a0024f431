#!/usr/bin/env node
// Files and snapshots with the TypeScript SDK (built: `npm run build` in sdk/typescript).
// Uploads a directory of data, runs an analysis that writes its results, downloads them,
// snapshots the analysed state and starts a second sandbox from it. Reads SERVICE_HOSTD_URL and
// SERVICE_API_KEY; exits non-zero on failure.
//
//   node examples/files-and-snapshots.mjs
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '../sdk/typescript/dist/src/index.js';

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

const local = await mkdtemp(join(tmpdir(), 'hostd-example-'));
const sandbox = await Sandbox.create();
const made = [sandbox];
let snapshot;
try {
  await mkdir(join(local, 'data'));
  await writeFile(join(local, 'data', 'scores.csv'), 'name,score\nada,90\nalan,85\ngrace,95\n');
  const up = await sandbox.files.uploadDir(join(local, 'data'), '/root/data');
  console.log(`uploaded ${up.files} file(s) to ${sandbox.id}:/root/data`);

  await sandbox.run(`import csv, json, os
rows = list(csv.DictReader(open("/root/data/scores.csv")))
best = max(rows, key=lambda r: int(r["score"]))
os.makedirs("/root/results", exist_ok=True)
json.dump({"best": best["name"], "n": len(rows)}, open("/root/results/summary.json", "w"))`);
  await sandbox.files.downloadDir('/root/results', join(local, 'results'));
  const summary = JSON.parse(await readFile(join(local, 'results', 'summary.json'), 'utf8'));
  console.log(`downloaded results: ${JSON.stringify(summary)}`);
  check(summary.best === 'grace' && summary.n === 3, JSON.stringify(summary));

  snapshot = await sandbox.snapshot();
  console.log(`snapshot ${snapshot.id} (${snapshot.info.size_bytes} bytes)`);
  const copy = await Sandbox.create({ snapshot });
  made.push(copy);
  const again = await copy.run('print(best["name"], len(rows))'); // the REPL state came along
  console.log(`a sandbox made from it still knows: ${again.stdout.trim()}`);
  check(again.stdout === 'grace 3\n', JSON.stringify(again));
} finally {
  for (const s of made) await s.delete().catch((err) => console.error(`cleanup: ${err.message}`));
  await snapshot?.delete().catch((err) => console.error(`cleanup: ${err.message}`));
  await rm(local, { recursive: true, force: true });
}
console.log('deleted; files-and-snapshots ok');
