/**
 * Frozen templates shared by the hostds of one test run. Every test file starts its own hostd on
 * a fresh data directory, and each template it serves cold-boots before it listens: 1-3 minutes
 * for `python` under TCG on a 2-core host, about 30 times in a run. A restart of hostd restores a
 * template frozen by an earlier run instead (`templates/<key>/` in the data directory, keyed by
 * everything that shapes the boot: vm/qemu/state-store.ts), and that is what the test run does
 * too: the first hostd to boot a template leaves it in the seed, and each later hostd finds it in
 * its new data directory, as a restarted one would. The cold boot stays covered by the first
 * start of each template and by the template tests, which use recipes of their own.
 *
 * `HOSTD_TEST_TEMPLATE_SEED` names the seed, a directory on the data directories' filesystem
 * (scripts/test.sh makes one per run under /var/tmp and removes it); unset, nothing is shared.
 * Files are hard links: a frozen template's files are never written after it is published.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** The run's seed, or undefined when templates are not shared. */
export function templateSeed(): string | undefined {
  return process.env.HOSTD_TEST_TEMPLATE_SEED || undefined;
}

/** Complete frozen templates in `templatesDir` (a template being booted is a `.boot-` folder). */
async function completeTemplates(templatesDir: string): Promise<string[]> {
  const names = await readdir(templatesDir).catch(() => [] as string[]);
  return names.filter((k) => !k.startsWith('.') && existsSync(join(templatesDir, k, 'complete')));
}

/**
 * Gives a data directory that has no templates yet (a new hostd's) every template of the seed.
 * A data directory with templates of its own (a restart test's second hostd) is left alone.
 */
export async function seedTemplates(dataDir: string): Promise<void> {
  const seed = templateSeed();
  const target = join(dataDir, 'templates');
  if (seed === undefined || existsSync(target)) return;
  const keys = await completeTemplates(join(seed, 'templates'));
  if (keys.length === 0) return;
  await mkdir(target, { recursive: true, mode: 0o750 });
  for (const key of keys) await run('cp', ['-al', join(seed, 'templates', key), join(target, key)]);
}

/** Adds the templates a hostd booted on `dataDir` that the seed lacks, each whole or not at all. */
export async function harvestTemplates(dataDir: string): Promise<void> {
  const seed = templateSeed();
  if (seed === undefined) return;
  const seedTemplatesDir = join(seed, 'templates');
  await mkdir(seedTemplatesDir, { recursive: true });
  const known = new Set(await completeTemplates(seedTemplatesDir));
  for (const key of await completeTemplates(join(dataDir, 'templates'))) {
    if (known.has(key)) continue;
    const partial = join(seedTemplatesDir, `.new-${key}-${process.pid}`);
    await run('cp', ['-al', join(dataDir, 'templates', key), partial]);
    // Another test process may have added the same key meanwhile: either copy will do.
    await rename(partial, join(seedTemplatesDir, key)).catch(() =>
      rm(partial, { recursive: true, force: true }),
    );
  }
}
