/**
 * contrib/systemd/hostd.service keeps what makes a crash cost seconds (docs/operations.md,
 * "Running under systemd"): it restarts on failure, never kills the VMs with hostd, reads the
 * SERVICE_* variables from its EnvironmentFile, and does not retry a configuration error. Where
 * systemd is installed, `systemd-analyze verify` checks the unit too.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CRASH_EXIT_CODE } from '../../src/fail-fast.js';
import { ROOT } from '../../testkit/root.js';

const DIR = join(ROOT, 'contrib', 'systemd');

/** `Key=value` settings of a unit file, by section (a key set twice keeps every value). */
function unitSettings(text: string): Map<string, string[]> {
  const settings = new Map<string, string[]>();
  let section = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const header = /^\[(\w+)\]$/.exec(line);
    if (header) {
      section = header[1]!;
      continue;
    }
    const eq = line.indexOf('=');
    const key = `${section}.${line.slice(0, eq)}`;
    settings.set(key, [...(settings.get(key) ?? []), line.slice(eq + 1)]);
  }
  return settings;
}

const unit = unitSettings(readFileSync(join(DIR, 'hostd.service'), 'utf8'));
const one = (key: string): string | undefined => unit.get(key)?.[0];

test('a crash restarts hostd in seconds, and the VMs outlive it for re-adoption', () => {
  assert.equal(one('Service.Restart'), 'on-failure');
  assert.match(one('Service.RestartSec') ?? '', /^[1-9]s?$/);
  assert.equal(one('Service.KillMode'), 'process');
  assert.equal(one('Service.OOMPolicy'), 'continue');
  assert.notEqual(CRASH_EXIT_CODE, 0, 'a crash is a failure systemd restarts');
  assert.equal(
    one('Service.RestartPreventExitStatus'),
    '2',
    'a configuration error is not retried',
  );
});

test('it runs the compiled hostd with the SERVICE_* variables of its EnvironmentFile', () => {
  assert.match(one('Service.ExecStart') ?? '', /^\/usr\/bin\/node \S+\/dist\/src\/main\.js$/);
  assert.equal(one('Service.EnvironmentFile'), '-/etc/hostd/hostd.env');
  const documented = readFileSync(join(ROOT, 'docs', 'operations.md'), 'utf8');
  const env = readFileSync(join(DIR, 'hostd.env'), 'utf8');
  const names = [...env.matchAll(/^#?(SERVICE_[A-Z_]+)=/gm)].map((m) => m[1]!);
  assert.ok(names.length >= 5);
  for (const name of names) {
    assert.ok(documented.includes(`| \`${name}\` |`), `${name} is a documented variable`);
  }
});

test('systemd-analyze verify accepts the unit', (t) => {
  const which = spawnSync('systemd-analyze', ['--version'], { encoding: 'utf8' });
  if (which.error) return t.skip('systemd-analyze is not installed (Debian package systemd)');
  const r = spawnSync('systemd-analyze', ['verify', join(DIR, 'hostd.service')], {
    encoding: 'utf8',
  });
  // It warns about the paths of this host (no /opt/hostd); only errors of the unit itself fail.
  const problems = `${r.stdout}${r.stderr}`
    .split('\n')
    .filter((l) => l.includes('hostd.service') && !l.includes('/opt/hostd'));
  assert.deepEqual(problems, []);
});
