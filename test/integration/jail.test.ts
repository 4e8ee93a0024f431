/**
 * The jail of each VM (docs/operations.md, Security), tested the way an attacker would use it:
 * the test plays a guest that has taken over its QEMU. It starts a process as sandbox A's uid,
 * in A's QEMU's namespaces and cgroup leaf, with no capabilities and no_new_privs (what A's
 * QEMU has), and shows what it cannot reach: sandbox B's sockets, overlay, images and process,
 * A's own frozen layers for writing, anything of the data directory or of other templates'
 * images by any name, and hostd's API. Real hostd, real VMs; needs root (hostd jails VMs only
 * as root).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import {
  chmod,
  mkdir,
  mkdtemp,
  readFile,
  readdir,
  readlink,
  rm,
  rmdir,
  stat,
  utimes,
  writeFile,
} from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { eventually } from '../../testkit/eventually.js';
import { sandboxQemuPid, startHostd, type Hostd } from '../../testkit/hostd.js';
import { run } from '../../testkit/exec.js';
import { createSandbox, reportFailure, withSandboxes } from '../../testkit/sandboxes.js';

const asRoot = process.getuid?.() === 0;
const TEMPLATE = 'python-slim';
const CACHE_DIR = process.env.SERVICE_CACHE_DIR ?? '/var/cache/hostd';

/** A uid range of its own: its start-up sweep must not meet other hostds' leaves on this host. */
const UIDS = { first: 240000, last: 249999 };
const env = {
  SERVICE_TEMPLATES: TEMPLATE,
  SERVICE_POOL_SIZE: '0',
  SERVICE_FORK_STANDBY_MAX: '0',
  SERVICE_VM_UID_RANGE: `${UIDS.first}-${UIDS.last}`,
};
let hostd: Hostd;
/** Kept across the restart of the last test: the second hostd re-adopts the first's VMs. */
let dataDir: string;
let stateDir: string;
before(async () => {
  if (!asRoot) return;
  dataDir = await mkdtemp('/var/tmp/hostd-test-data-');
  stateDir = await mkdtemp('/dev/shm/hostd-test-');
  hostd = await startHostd({ env, dataDir, stateDir });
});
after(async () => {
  await hostd?.stop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** What the jail of sandbox `id` is made of, read from the host. */
interface JailOf {
  pid: number;
  uid: number;
  vmDir: string;
  /** Its overlay (the one disk file it writes) and the record naming the layer under it. */
  top: string;
  /** Its view of the data directory (vm/host/vm-view.ts). */
  view: string;
  cgroupProcs: string[];
}

async function jailOf(id: string): Promise<JailOf> {
  const pid = await sandboxQemuPid(hostd, id);
  const record = JSON.parse(
    await readFile(join(hostd.dataDir, 'sandboxes', `${id}.json`), 'utf8'),
  ) as { vm: string; running: { disk: string } };
  const vmDir = join(hostd.stateDir, 'vms', record.vm);
  const uid = (await stat(vmDir)).uid;
  return {
    pid,
    uid,
    vmDir,
    top: join(hostd.dataDir, 'disks', `${record.running.disk}.qcow2`),
    view: join(hostd.dataDir, 'views', record.vm),
    cgroupProcs: await cgroupProcsOf(pid),
  };
}

/** The cgroup.procs files of the leaves process `pid` is in (v2, or v1's hierarchies). */
async function cgroupProcsOf(pid: number): Promise<string[]> {
  const files: string[] = [];
  for (const line of (await readFile(`/proc/${pid}/cgroup`, 'utf8')).trim().split('\n')) {
    const [, controllers, path] = line.split(':') as [string, string, string];
    if (!path.startsWith('/hostd-vms/')) continue;
    const roots =
      controllers === ''
        ? ['/sys/fs/cgroup', '/sys/fs/cgroup/unified']
        : controllers.split(',').map((c) => `/sys/fs/cgroup/${c}`);
    for (const root of roots) {
      const procs = join(root, path, 'cgroup.procs');
      if (spawnSync('test', ['-e', procs]).status === 0) files.push(procs);
    }
  }
  return files;
}

/**
 * Runs the Python `script` as a compromised QEMU of `jail` would: in its cgroup leaf, its
 * mount, PID, network, IPC, UTS and cgroup namespaces, as its uid with its group, no
 * capabilities and no_new_privs. The script prints one JSON object; returns it. `hostMounts`:
 * in the host's mount namespace instead, to show what the files' own permissions refuse, for
 * the moment one is linked into the VM's view.
 */
function asCompromisedQemu(
  jail: JailOf,
  script: string,
  args: Record<string, unknown>,
  hostMounts = false,
): Record<string, string> {
  const r = spawnSync(
    '/bin/sh',
    [
      '-c',
      'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"',
      'attacker',
      ...jail.cgroupProcs,
      '--',
      'nsenter',
      `--target=${jail.pid}`,
      ...(hostMounts ? [] : ['--mount']),
      '--pid',
      '--net',
      '--ipc',
      '--uts',
      '--cgroup',
      '--',
      'setpriv',
      `--reuid=${jail.uid}`,
      `--regid=${jail.uid}`,
      `--groups=${hostdVmGid()}`,
      '--inh-caps=-all',
      '--bounding-set=-all',
      '--no-new-privs',
      '--',
      // Debian's, not whatever is first on the test's PATH (a pyenv shim under /root).
      '/usr/bin/python3',
      '-c',
      ATTACK_PRELUDE + script,
      JSON.stringify(args),
    ],
    { encoding: 'utf8', timeout: 30_000 },
  );
  assert.equal(r.status, 0, `the attacker did not run: ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, string>;
}

function hostdVmGid(): number {
  const line = spawnSync('getent', ['group', 'hostd-vm'], { encoding: 'utf8' }).stdout;
  return Number(line.split(':')[2]);
}

/** `attempt(name, fn)` records "ok" or the errno's name of each try; `done()` prints them. */
const ATTACK_PRELUDE = `
import errno, json, os, signal, socket, sys
args = json.loads(sys.argv[1])
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = 'ok'
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
def done():
    print(json.dumps(results))
`;

describe('a compromised QEMU, jailed', { skip: !asRoot && 'needs root' }, () => {
  test('runs as a uid of its own, with no capabilities, no_new_privs and its own namespaces and leaf', async () => {
    await withSandboxes(hostd, async ({ create }) => {
      const [a, b] = [await create({ template: TEMPLATE }), await create({ template: TEMPLATE })];
      const [ja, jb] = [await jailOf(a), await jailOf(b)];
      assert.notEqual(ja.uid, jb.uid);
      assert.ok(ja.uid >= UIDS.first && jb.uid >= UIDS.first, `uids ${ja.uid}, ${jb.uid}`);
      const status = await readFile(`/proc/${ja.pid}/status`, 'utf8');
      assert.match(status, /^CapEff:\s+0+$/m);
      assert.match(status, /^CapBnd:\s+0+$/m);
      assert.match(status, /^NoNewPrivs:\s+1$/m);
      assert.match(status, /^Seccomp:\s+2$/m); // -sandbox on
      for (const ns of ['mnt', 'pid', 'net', 'ipc']) {
        const [mine, its] = await Promise.all([
          readlink(`/proc/self/ns/${ns}`),
          readlink(`/proc/${ja.pid}/ns/${ns}`),
        ]);
        assert.notEqual(its, mine, `${ns} namespace`);
      }
      assert.ok(ja.cgroupProcs.length > 0, 'a cgroup leaf');
      const vmDir = await stat(ja.vmDir);
      assert.equal(vmDir.mode & 0o777, 0o700);
      const top = await stat(ja.top);
      assert.equal(top.uid, ja.uid);
      assert.equal(top.mode & 0o777, 0o600);
      // When the VM ends, its leaf goes with it.
      assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${a}`)).status, 204);
      const leaves = ja.cgroupProcs.map((procs) => dirname(procs));
      await eventually("the deleted VM's cgroup leaves to be removed", () =>
        leaves.every((leaf) => !existsSync(leaf)),
      );
    });
  });

  test('cannot reach another VM: its sockets, overlay, process, memory, or the names of its files; sees none of the host scratch space', async () => {
    // A file of the host's /tmp, readable by anyone there.
    const hostTmp = await mkdtemp('/tmp/hostd-jail-test-');
    const hostTmpFile = join(hostTmp, 'note');
    await writeFile(hostTmpFile, 'host');
    await chmod(hostTmp, 0o755);
    await chmod(hostTmpFile, 0o644);
    try {
      await withSandboxes(hostd, async ({ create }) => {
        const [a, b] = [await create({ template: TEMPLATE }), await create({ template: TEMPLATE })];
        const [ja, jb] = [await jailOf(a), await jailOf(b)];
        const results = asCompromisedQemu(
          ja,
          `
for sock in ('qmp.sock', 'agent.sock', 'files.sock'):
    def connect(path=os.path.join(args['bDir'], sock)):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
    attempt('connect B ' + sock, connect)
attempt('read B overlay', lambda: open(args['bTop'], 'rb').read(1))
attempt('write B overlay', lambda: open(args['bTop'], 'r+b'))
attempt('read B view', lambda: os.listdir(args['bView']))
attempt('read B RAM image', lambda: open(args['bImage'], 'rb'))
attempt('read B memory', lambda: open('/proc/%d/mem' % args['bPid'], 'rb'))
attempt('signal B', lambda: os.kill(args['bPid'], signal.SIGKILL))
attempt('list vms', lambda: os.listdir(os.path.join(args['stateDir'], 'vms')))
attempt('list data dir', lambda: os.listdir(args['dataDir']))
for d in ('disks', 'images', 'templates', 'paused', 'sandboxes'):
    attempt('enter ' + d, lambda p=os.path.join(args['dataDir'], d): os.stat(p))
# Its mount namespace: its own folder, nobody else's; no records, no scratch space of the host.
results['own folder holds its QMP socket'] = str('qmp.sock' in os.listdir(args['aDir']))
results['own view holds'] = str(os.listdir(args['aView']))
attempt('read own overlay by its host name', lambda: open(args['aTop'], 'rb'))
attempt('read B record', lambda: open(os.path.join(args['dataDir'], 'sandboxes', args['b'] + '.json')))
attempt('read host tmp file', lambda: open(args['hostTmpFile']))
# The template cache: only its own image's folder.
attempt('list cache', lambda: os.listdir(args['cacheDir']))
attempt('read own image', lambda: open(args['ownImage'], 'rb').read(1))
attempt('enter other template images', lambda: os.stat(args['otherImages']))
results['tmp holds'] = str(os.listdir('/tmp'))
results['run holds'] = str(os.listdir('/run'))
attempt('write tmp', lambda: open('/tmp/planted', 'w'))
pids = [p for p in os.listdir('/proc') if p.isdigit()]
others = [p for p in pids if p != str(os.getpid())]  # its own command line holds B's folder
results['processes seen'] = str(len(pids))
results['sees B'] = str(any(args['bDir'] in open('/proc/%s/cmdline' % p, 'rb').read().decode(errors='replace') for p in others))
done()
`,
          {
            aDir: ja.vmDir,
            aView: ja.view,
            aTop: ja.top,
            b,
            bDir: jb.vmDir,
            bTop: jb.top,
            bView: jb.view,
            bImage: await ramImageOf(jb.pid),
            bPid: jb.pid,
            cacheDir: CACHE_DIR,
            ownImage: await rootfsOf(ja.pid),
            otherImages: join(CACHE_DIR, 'templates', 'python'),
            stateDir: hostd.stateDir,
            dataDir: hostd.dataDir,
            hostTmpFile,
          },
        );
        assert.deepEqual(results, {
          // B's folder is not in A's view of vms/ at all.
          'connect B qmp.sock': 'ENOENT',
          'connect B agent.sock': 'ENOENT',
          'connect B files.sock': 'ENOENT',
          // Nor is anything of the data directory but A's own view: B's files are not there
          // to open, by any name.
          'read B overlay': 'ENOENT',
          'write B overlay': 'ENOENT',
          'read B view': 'ENOENT',
          'read B RAM image': 'ENOENT',
          // B's QEMU is not in A's PID namespace: its pid names nothing there.
          'read B memory': 'ENOENT',
          'signal B': 'ESRCH',
          'list vms': 'EACCES',
          'list data dir': 'EACCES',
          'enter disks': 'ENOENT',
          'enter images': 'ENOENT',
          'enter templates': 'ENOENT',
          'enter paused': 'ENOENT',
          'enter sandboxes': 'ENOENT',
          'own folder holds its QMP socket': 'True',
          // Its own files were linked into its view only until QEMU had them open.
          'own view holds': '[]',
          'read own overlay by its host name': 'ENOENT',
          'read B record': 'ENOENT',
          'list cache': 'EACCES',
          'read own image': 'ok',
          'enter other template images': 'ENOENT',
          'read host tmp file': 'ENOENT',
          'tmp holds': '[]',
          'run holds': '[]',
          'write tmp': 'EROFS',
          // A's QEMU (its PID 1) and the attacker itself.
          'processes seen': '2',
          'sees B': 'False',
        });
        // B never noticed.
        assert.equal((await run(hostd, b, 'print(1)')).stdout.trim(), '1');
      });
    } finally {
      await rm(hostTmp, { recursive: true, force: true });
    }
  });

  test('cannot write the layers its disk sits on, nor its RAM image, nor reach hostd over the network', async () => {
    await withSandboxes(hostd, async ({ create, track }) => {
      const a = await create({ template: TEMPLATE });
      await run(hostd, a, 'open("/tmp/x", "w").write("parent")');
      // A fork freezes A's overlay: it becomes a layer under A and its child.
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${a}/fork`,
        { n: 1 },
      );
      assert.equal(fork.status, 200, JSON.stringify(fork.body));
      track(fork.body.children.map((c) => c.id));
      const ja = await jailOf(a);
      const topRecord = JSON.parse(await readFile(ja.top.replace(/\.qcow2$/, '.json'), 'utf8')) as {
        backing: string;
      };
      const layer = join(hostd.dataDir, 'disks', `${topRecord.backing}.qcow2`);
      const templateLayers = (await readdir(join(hostd.dataDir, 'templates')))
        .filter((k) => !k.startsWith('.'))
        .map((k) => join(hostd.dataDir, 'templates', k, 'disk.qcow2'));
      const port = Number(new URL(hostd.url).port);
      // The image its RAM maps copy-on-write, shared with every VM restored from it.
      const ramImage = await ramImageOf(ja.pid);
      const results = asCompromisedQemu(
        ja,
        `
attempt('write own frozen layer', lambda: open(args['layer'], 'r+b'))
for i, t in enumerate(args['templateLayers']):
    attempt('write template layer %d' % i, lambda t=t: open(t, 'r+b'))
def api():
    s = socket.create_connection(('127.0.0.1', args['port']), timeout=5)
attempt('reach hostd API', api)
results['interfaces'] = ','.join(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))
done()
`,
        { layer, templateLayers, port },
      );
      // Not in its mount namespace at all...
      assert.equal(results['write own frozen layer'], 'ENOENT');
      templateLayers.forEach((_, i) =>
        assert.equal(results[`write template layer ${i}`], 'ENOENT'),
      );
      // ...and read-only by their own permissions, for the moment one is linked into its view.
      const byPermissions = asCompromisedQemu(
        ja,
        `
attempt('write own frozen layer', lambda: open(args['layer'], 'r+b'))
attempt('read own frozen layer', lambda: open(args['layer'], 'rb').read(1))
for i, t in enumerate(args['templateLayers']):
    attempt('write template layer %d' % i, lambda t=t: open(t, 'r+b'))
attempt('write own RAM image', lambda: open(args['ramImage'], 'r+b'))
attempt('read own RAM image', lambda: open(args['ramImage'], 'rb').read(1))
done()
`,
        { layer, templateLayers, ramImage },
        true,
      );
      assert.equal(byPermissions['write own frozen layer'], 'EACCES');
      assert.equal(byPermissions['read own frozen layer'], 'ok');
      templateLayers.forEach((_, i) =>
        assert.equal(byPermissions[`write template layer ${i}`], 'EACCES'),
      );
      assert.equal(byPermissions['write own RAM image'], 'EACCES');
      assert.equal(byPermissions['read own RAM image'], 'ok');
      // Nor can A's QEMU itself: it reopened the layer it froze read-only, and holds its RAM
      // image read-only (vm/host/ram-open-shim.ts).
      assert.deepEqual(await openModes(ja.pid, layer), ['O_RDONLY']);
      assert.deepEqual(await openModes(ja.pid, ramImage), ['O_RDONLY']);
      assert.notEqual(results['reach hostd API'], 'ok');
      assert.equal(results.interfaces, 'lo');
      // The host itself reaches hostd: the refusal above is the jail's.
      assert.equal((await hostd.request('GET', '/v1/sandboxes')).status, 200);
    });
  });

  test('a VM re-adopted after a crash of hostd keeps its uid and leaf; stale leaves are swept; new VMs get other uids', async () => {
    // Not withSandboxes: its clean-up would talk to the hostd this test kills.
    const ids: string[] = [];
    let stale: string[] = [];
    try {
      ids.push(await createSandbox(hostd, { template: TEMPLATE }));
      const before = await jailOf(ids[0]!);
      await hostd.stop('SIGKILL');
      // The empty leaf a VM that ended while no hostd ran would leave (its uid the range's last,
      // not this VM's), made long ago: the next start sweeps it away.
      stale = before.cgroupProcs.map((procs) => join(dirname(dirname(procs)), `vm-${UIDS.last}`));
      for (const leaf of stale) {
        await mkdir(leaf, { recursive: true });
        await utimes(leaf, new Date(0), new Date(0));
      }
      hostd = await startHostd({ env, dataDir, stateDir });
      assert.equal((await run(hostd, ids[0]!, 'print(1)')).stdout.trim(), '1');
      const after = await jailOf(ids[0]!);
      assert.equal(after.pid, before.pid);
      assert.equal(after.uid, before.uid);
      await eventually('the stale leaves to be swept', () =>
        stale.every((leaf) => !existsSync(leaf)),
      );
      assert.deepEqual(after.cgroupProcs, before.cgroupProcs, "the re-adopted VM's leaf stays");
      // A capture of the re-adopted VM freezes its overlay: QEMU reopens it read-only, as for
      // a VM this hostd started.
      const fork = await hostd.json<{ children: { id: string }[] }>(
        'POST',
        `/v1/sandboxes/${ids[0]!}/fork`,
        { n: 1 },
      );
      assert.equal(fork.status, 200, JSON.stringify(fork.body));
      ids.push(...fork.body.children.map((c) => c.id));
      const frozen = JSON.parse(await readFile(after.top.replace(/\.qcow2$/, '.json'), 'utf8')) as {
        backing: string;
      };
      const layer = join(hostd.dataDir, 'disks', `${frozen.backing}.qcow2`);
      assert.deepEqual(await openModes(after.pid, layer), ['O_RDONLY']);
      assert.deepEqual(await readdir(after.view), [], 'its view is empty at rest');
      ids.push(await createSandbox(hostd, { template: TEMPLATE }));
      assert.notEqual((await jailOf(ids[1]!)).uid, before.uid);
    } catch (err) {
      for (const id of ids) await reportFailure(hostd, id);
      throw err;
    } finally {
      for (const id of ids) await hostd.request('DELETE', `/v1/sandboxes/${id}`);
      // A cgroup folder goes by rmdir; gone already (swept) is the expected case.
      for (const leaf of stale) await rmdir(leaf).catch(() => undefined);
    }
  });
});

/**
 * How process `pid` holds the file at `path` open: the access mode of each descriptor on it.
 * Matched by inode: a jailed QEMU opened it by a name in its view that is gone since.
 */
async function openModes(pid: number, path: string): Promise<string[]> {
  const file = await stat(path);
  const modes: string[] = [];
  for (const fd of await readdir(`/proc/${pid}/fd`)) {
    const target = await stat(`/proc/${pid}/fd/${fd}`).catch(() => null);
    if (!target || target.ino !== file.ino || target.dev !== file.dev) continue;
    const info = await readFile(`/proc/${pid}/fdinfo/${fd}`, 'utf8');
    const flags = parseInt(/^flags:\s+(\d+)$/m.exec(info)![1]!, 8);
    modes.push(['O_RDONLY', 'O_WRONLY', 'O_RDWR'][flags & 3]!);
  }
  return modes;
}

/** The file process `pid` maps as guest RAM (a jailed QEMU's: by its view's name, now gone). */
async function ramImageOf(pid: number): Promise<string> {
  const maps = await readFile(`/proc/${pid}/maps`, 'utf8');
  const line = maps.split('\n').find((l) => /\.(mem|img)( \(deleted\))?$/.test(l));
  assert.ok(line, 'QEMU maps a RAM image');
  // The view's name spells the file's path in the data directory, '/' as '%'.
  const name = line.split(/\s+/)[5]!.split('/').at(-1)!.replaceAll('%', '/');
  return join(hostd.dataDir, name);
}

/** The root filesystem image process `pid` was started with. */
async function rootfsOf(pid: number): Promise<string> {
  const args = (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0');
  const blockdev = args.find((a) => a.includes('node-name=rootfs-file'))!;
  return /filename=([^,]+)/.exec(blockdev)![1]!;
}
