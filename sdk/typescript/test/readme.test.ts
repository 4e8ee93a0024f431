/**
 * The README's examples are programs: every `js` block runs as an ES module importing
 * `@hostd/sdk` (this package, by self-reference), every `sh` block runs in bash with `sbx` on
 * PATH, both against the real hostd. A block after a `<!-- requires: files, pause -->` line is
 * skipped, saying why, while the server lacks one of those features. Unit part: the README has
 * the blocks it promises, and shows `sbx --help` as it is.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { LIVE_TIMEOUT_MS, LIVE_URL, PACKAGE_DIR, skipLive } from './helpers/live.js';
import { isFeature, lacks, type Feature } from './helpers/features.js';
import { run, sbx, sbxShimDir } from './helpers/run.js';

interface Block {
  lang: 'js' | 'sh';
  code: string;
  line: number;
  title: string;
  /** From a `<!-- requires: ... -->` line right before the block. */
  requires: Feature[];
}

function blocks(markdown: string): Block[] {
  const found: Block[] = [];
  const fence = /^```(js|sh)\n([\s\S]*?)^```$/gm;
  let title = '';
  for (let m = fence.exec(markdown); m; m = fence.exec(markdown)) {
    const before = markdown.slice(0, m.index);
    title = [...before.matchAll(/^#+ (.*)$/gm)].at(-1)?.[1] ?? title;
    const marker = /<!-- requires: ([^>]*) -->\n\s*$/.exec(before);
    const requires = (marker?.[1] ?? '')
      .split(',')
      .map((f) => f.trim())
      .filter((f) => f !== '');
    for (const f of requires) assert.ok(isFeature(f), `README.md: unknown feature "${f}"`);
    found.push({
      lang: m[1] as 'js' | 'sh',
      code: m[2]!,
      line: before.split('\n').length,
      title,
      requires: requires as Feature[],
    });
  }
  return found;
}

const readme = await readFile(join(PACKAGE_DIR, 'README.md'), 'utf8');
const all = blocks(readme);

describe('README', () => {
  test('has runnable js blocks for every scenario and an sh block for the CLI', () => {
    const titles = all.map((b) => b.title).join(' | ');
    for (const word of [
      'Quick start',
      'Exceptions',
      'Bash',
      'Streaming',
      'Environment',
      'Rich outputs',
      'Fork',
      'Files',
      'Snapshots',
      'Pause',
      'Templates',
      'Errors',
      'Tracing',
      'CLI',
    ]) {
      assert.ok(titles.includes(word), `no block under a heading with "${word}": ${titles}`);
    }
    for (const b of all.filter((x) => x.lang === 'js')) assert.match(b.code, /from '@hostd\/sdk'/);
  });

  test('shows `sbx --help` as it is', async () => {
    const help = await sbx(['--help']);
    assert.ok(
      readme.includes(`$ sbx --help\n${help.stdout}\`\`\``),
      'README.md: update the sbx --help block',
    );
  });
});

describe(
  'README examples against a real hostd',
  { skip: skipLive, timeout: all.length * LIVE_TIMEOUT_MS },
  () => {
    const dir = join(PACKAGE_DIR, 'dist', 'readme-blocks');
    const env = { SERVICE_HOSTD_URL: LIVE_URL, SERVICE_API_KEY: process.env.SERVICE_API_KEY };
    const cleanup: string[] = [];
    after(async () => {
      for (const d of cleanup) await rm(d, { recursive: true, force: true });
    });

    for (const block of all) {
      test(
        `${block.lang} block at README.md:${block.line} (${block.title})`,
        { timeout: LIVE_TIMEOUT_MS },
        async (t) => {
          for (const feature of block.requires) {
            const lacking = await lacks(feature);
            if (lacking) return t.skip(lacking);
          }
          let r;
          if (block.lang === 'js') {
            // Inside the package directory, so that `import '@hostd/sdk'` resolves to this package.
            await mkdir(dir, { recursive: true });
            const file = join(dir, `block-${block.line}.mjs`);
            await writeFile(file, block.code);
            cleanup.push(file);
            r = await run(process.execPath, [file], { env, timeoutMs: LIVE_TIMEOUT_MS });
          } else {
            const bin = await sbxShimDir();
            const cwd = await mkdtemp(join(tmpdir(), 'hostd-readme-sh-'));
            cleanup.push(bin, cwd);
            r = await run('bash', ['-euo', 'pipefail', '-c', block.code], {
              env: { ...env, PATH: `${bin}:${process.env.PATH ?? ''}` },
              cwd,
              timeoutMs: LIVE_TIMEOUT_MS,
            });
          }
          assert.equal(
            r.code,
            0,
            `exit ${r.code} ${r.signal ?? ''}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`,
          );
        },
      );
    }
  },
);
