import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ConfigError,
  isLoopback,
  loadConfig,
  parseAddr,
  loadTemplateSettings,
  parseTemplates,
  RETIRED_VARS,
} from '../../src/config.js';

test('SERVICE_HOSTD_ADDR defaults to 127.0.0.1:7070', () => {
  const c = loadConfig({});
  assert.equal(c.host, '127.0.0.1');
  assert.equal(c.port, 7070);
});

test('addresses: host:port, [v6]:port and a bare port', () => {
  assert.deepEqual(parseAddr('0.0.0.0:80'), { host: '0.0.0.0', port: 80 });
  assert.deepEqual(parseAddr('[::1]:7070'), { host: '::1', port: 7070 });
  assert.deepEqual(parseAddr('9000'), { host: '127.0.0.1', port: 9000 });
  assert.throws(() => parseAddr('nonsense'), ConfigError);
  assert.throws(() => parseAddr('1.2.3.4:99999'), ConfigError);
});

test('loopback is 127.0.0.0/8, ::1 and localhost, nothing else', () => {
  for (const h of ['127.0.0.1', '127.1.2.3', '::1', 'localhost']) assert.ok(isLoopback(h), h);
  for (const h of ['0.0.0.0', '10.0.0.1', '::', '192.168.1.1']) assert.ok(!isLoopback(h), h);
});

test('API keys are a comma-separated list, blanks ignored', () => {
  assert.deepEqual(loadConfig({ SERVICE_API_KEYS: 'a, b,,c ' }).apiKeys, ['a', 'b', 'c']);
});

test('only the exact value 1 disables auth', () => {
  assert.equal(loadConfig({ SERVICE_AUTH_DISABLED: '1' }).authDisabled, true);
  assert.equal(loadConfig({ SERVICE_AUTH_DISABLED: 'true' }).authDisabled, false);
});

test('numeric variables are range-checked with the variable named in the error', () => {
  assert.throws(() => loadConfig({ SERVICE_POOL_SIZE: '-1' }), /SERVICE_POOL_SIZE/);
  assert.throws(() => loadConfig({ SERVICE_VM_MEMORY_MIB: '64' }), /SERVICE_VM_MEMORY_MIB/);
  assert.throws(() => loadConfig({ SERVICE_ACCEL: 'xen' }), /SERVICE_ACCEL/);
});

test('templates: the first listed is the default; each lists only what it overrides', () => {
  assert.deepEqual(parseTemplates('python,big:mem=2048:cpus=2:pool=0,cold:recipe=python:pool=0'), [
    { name: 'python' },
    { name: 'big', memoryMib: 2048, vcpus: 2, poolSize: 0 },
    { name: 'cold', recipe: 'python', poolSize: 0 },
  ]);
  for (const bad of ['a,a', 'Bad!', 'x:gpu=1', 'x:recipe=', 'x:recipe=No!']) {
    assert.throws(() => parseTemplates(bad), ConfigError, bad);
  }
});

test('templates: unset or empty serves every recipe; SERVICE_VM_* override only when set', () => {
  assert.equal(loadConfig({}).templates, null);
  assert.equal(loadConfig({ SERVICE_TEMPLATES: ' ' }).templates, null);
  assert.deepEqual(loadConfig({}).templateDefaults, {});
  assert.deepEqual(
    loadConfig({ SERVICE_VM_MEMORY_MIB: '768', SERVICE_POOL_SIZE: '0', SERVICE_VM_VCPUS: '' })
      .templateDefaults,
    { memoryMib: 768, poolSize: 0 },
  );
  assert.equal(loadConfig({ SERVICE_TEMPLATE_DIR: '/srv/recipes' }).templateDir, '/srv/recipes');
});

test('templates: a bad or empty option value is refused, naming the template and the option', () => {
  for (const [spec, named] of [
    ['python:mem', 'SERVICE_TEMPLATES: python:mem'],
    ['python:mem=', 'SERVICE_TEMPLATES: python:mem'],
    ['python:mem=64', 'SERVICE_TEMPLATES: python:mem'],
    ['big:cpus=x', 'SERVICE_TEMPLATES: big:cpus'],
    ['big:pool=-1', 'SERVICE_TEMPLATES: big:pool'],
  ]) {
    assert.throws(
      () => parseTemplates(spec!),
      (err: unknown) => err instanceof ConfigError && err.message.startsWith(named!),
      spec,
    );
  }
});

test('the sandbox cap follows host memory unless SERVICE_MAX_SANDBOXES sets a number', () => {
  assert.equal(loadConfig({}).maxSandboxes, null);
  assert.equal(loadConfig({ SERVICE_MAX_SANDBOXES: 'auto' }).maxSandboxes, null);
  assert.equal(loadConfig({ SERVICE_MAX_SANDBOXES: '7' }).maxSandboxes, 7);
  assert.throws(() => loadConfig({ SERVICE_MAX_SANDBOXES: '0' }), ConfigError);
});

test('MCP sessions: sandboxes deleted at the end and an hour idle by default; bad values refused', () => {
  const c = loadConfig({});
  assert.equal(c.mcpSessionEnd, 'delete');
  assert.equal(c.mcpSessionIdleS, 3600);
  const set = loadConfig({ SERVICE_MCP_SESSION_END: 'pause', SERVICE_MCP_SESSION_IDLE_S: '0' });
  assert.equal(set.mcpSessionEnd, 'pause');
  assert.equal(set.mcpSessionIdleS, 0);
  assert.throws(() => loadConfig({ SERVICE_MCP_SESSION_END: 'drop' }), /SERVICE_MCP_SESSION_END/);
  assert.throws(
    () => loadConfig({ SERVICE_MCP_SESSION_IDLE_S: '-5' }),
    /SERVICE_MCP_SESSION_IDLE_S/,
  );
});

test('SERVICE_TCG_CPU names a QEMU CPU model with its options, or keeps the manifest one', () => {
  assert.equal(loadConfig({}).tcgCpu, null);
  assert.equal(loadConfig({ SERVICE_TCG_CPU: '' }).tcgCpu, null);
  assert.equal(loadConfig({ SERVICE_TCG_CPU: 'max' }).tcgCpu, 'max');
  assert.equal(
    loadConfig({ SERVICE_TCG_CPU: 'qemu64,+rdrand,-avx,vendor=GenuineIntel' }).tcgCpu,
    'qemu64,+rdrand,-avx,vendor=GenuineIntel',
  );
  for (const bad of ['max -smp 4', 'max,,x', ',max', 'max;rm']) {
    assert.throws(() => loadConfig({ SERVICE_TCG_CPU: bad }), /SERVICE_TCG_CPU/, bad);
  }
});

test('the TCG translation buffer defaults to 32 MiB: 16 thrashed under the data stack', () => {
  assert.equal(loadConfig({}).tcgTbMib, 32);
  assert.equal(loadConfig({ SERVICE_TCG_TB_MIB: '16' }).tcgTbMib, 16);
});

test('SERVICE_E2B_ADDR: the native host on 49982 by default, port 0 with a native port 0, off', () => {
  assert.deepEqual(loadConfig({}).e2bAddr, { host: '127.0.0.1', port: 49982 });
  assert.deepEqual(loadConfig({ SERVICE_HOSTD_ADDR: '0.0.0.0:8080' }).e2bAddr, {
    host: '0.0.0.0',
    port: 49982,
  });
  assert.deepEqual(loadConfig({ SERVICE_HOSTD_ADDR: '127.0.0.1:0' }).e2bAddr, {
    host: '127.0.0.1',
    port: 0,
  });
  assert.deepEqual(loadConfig({ SERVICE_E2B_ADDR: '[::1]:9000' }).e2bAddr, {
    host: '::1',
    port: 9000,
  });
  assert.equal(loadConfig({ SERVICE_E2B_ADDR: 'off' }).e2bAddr, null);
  assert.throws(() => loadConfig({ SERVICE_E2B_ADDR: 'nonsense' }), /SERVICE_E2B_ADDR/);
});

test('SERVICE_CACHE_DIR and SERVICE_TEMPLATE_DIR are read the same by hostd and the template CLI', () => {
  const env = { SERVICE_CACHE_DIR: '/c', SERVICE_TEMPLATE_DIR: '/t' };
  assert.deepEqual(loadTemplateSettings(env), { cacheDir: '/c', templateDir: '/t' });
  const c = loadConfig(env);
  assert.deepEqual({ cacheDir: c.cacheDir, templateDir: c.templateDir }, loadTemplateSettings(env));
  assert.equal(loadTemplateSettings({}).templateDir, '');
  assert.ok(loadTemplateSettings({}).cacheDir.endsWith('hostd'));
});

test('the template CLI does not refuse a variable only hostd reads', () => {
  assert.throws(() => loadConfig({ SERVICE_POOL_SIZE: 'many' }), ConfigError);
  assert.doesNotThrow(() => loadTemplateSettings({ SERVICE_POOL_SIZE: 'many' }));
});

test('a retired variable that is set is listed for a warning, not refused', () => {
  assert.deepEqual(loadConfig({}).retired, []);
  const retired = loadConfig({ SERVICE_IMAGE_DIR: '/old' }).retired;
  assert.deepEqual(
    retired.map((v) => v.name),
    ['SERVICE_IMAGE_DIR'],
  );
  assert.ok(RETIRED_VARS.every((v) => v.why !== ''));
});

test('KSM covers all of QEMU by default; SERVICE_KSM_SCOPE=guest-ram sets it back to guest RAM', () => {
  assert.equal(loadConfig({}).ksmScope, 'qemu');
  assert.equal(loadConfig({ SERVICE_KSM_SCOPE: 'guest-ram' }).ksmScope, 'guest-ram');
  assert.throws(() => loadConfig({ SERVICE_KSM_SCOPE: 'all' }), ConfigError);
});

test("the pool warms its machines' files path only when SERVICE_POOL_WARM_FILES=1", () => {
  assert.equal(loadConfig({}).poolWarmFiles, false);
  assert.equal(loadConfig({ SERVICE_POOL_WARM_FILES: '1' }).poolWarmFiles, true);
});
