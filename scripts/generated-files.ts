/**
 * The one ending of every generator in scripts/ (gen-openapi.ts, gen-sdk-types.ts): write the
 * files it renders, or with `--check` (CI, scripts/test.sh) write nothing and fail naming the
 * stale ones, so that a change to a source comes with its regenerated files.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** A file a generator renders, its path relative to the repository. */
export interface GeneratedFile {
  readonly path: string;
  readonly text: string;
}

/** The rendered files whose checked-in text differs (a missing file differs). */
export function staleFiles(root: string, files: readonly GeneratedFile[]): string[] {
  return files
    .filter(({ path, text }) => {
      try {
        return readFileSync(join(root, path), 'utf8') !== text;
      } catch {
        return true;
      }
    })
    .map(({ path }) => path);
}

/**
 * Writes the stale files, or with `--check` in argv only reports them and sets exit code 1.
 * `tool` prefixes every line; `regenerate` is the command that a stale check tells to run.
 */
export function writeOrCheck(
  root: string,
  files: readonly GeneratedFile[],
  tool: string,
  regenerate: string,
): void {
  const stale = staleFiles(root, files);
  if (process.argv.includes('--check')) {
    if (stale.length === 0) {
      console.log(`${tool}: ${files.map((f) => f.path).join(' and ')} current`);
      return;
    }
    console.error(
      `${tool}: ${stale.join(' and ')} ${stale.length > 1 ? 'are' : 'is'} stale: ` +
        `run \`${regenerate}\` and commit the result.`,
    );
    process.exitCode = 1;
    return;
  }
  for (const { path, text } of files) {
    if (!stale.includes(path)) {
      console.log(`${tool}: ${path} is up to date`);
      continue;
    }
    writeFileSync(join(root, path), text);
    console.log(`${tool}: wrote ${path}`);
  }
}
