#!/usr/bin/env node
// Quick start with the TypeScript SDK (built: `npm run build` in sdk/typescript).
// Creates a sandbox, keeps Python state across runs, forks two children, merges one back,
// deletes everything. Reads SERVICE_HOSTD_URL and SERVICE_API_KEY; exits non-zero on failure.
//
//   node examples/quickstart.mjs
import { Sandbox } from '../sdk/typescript/dist/src/index.js';

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

const sandbox = await Sandbox.create();
const children = [];
try {
  console.log(`created ${sandbox.id}`);

  await sandbox.run('import math\nvalues = [math.pi]');
  const first = await sandbox.run(
    'values.append(2 * values[0])\nprint(len(values), round(values[-1], 4))',
  );
  console.log(`state persists: ${first.stdout.trim()}`);
  check(first.stdout === '2 6.2832\n' && first.exitCode === 0, JSON.stringify(first));

  children.push(...(await sandbox.fork(2)));
  console.log(`forked ${children.map((c) => c.id).join(' ')}`);
  for (const [i, child] of children.entries()) {
    const r = await child.run(`values.append(${i})\nprint(values[-1])`, {
      onStdout: (line) => console.log(`  child ${i} says ${line}`),
    });
    check(r.stdout === `${i}\n`, JSON.stringify(r));
  }

  await sandbox.merge(children[1]);
  const merged = await sandbox.run('print(values[-1], len(values))');
  console.log(`after merging child 1 the parent has: ${merged.stdout.trim()}`);
  check(merged.stdout === '1 3\n', JSON.stringify(merged));
  children.pop(); // the winner's id is gone now
} finally {
  for (const s of [...children, sandbox]) {
    await s.delete().catch((err) => console.error(`cleanup of ${s.id}: ${err.message}`));
  }
}
console.log('deleted; quickstart ok');
