/** `sbx cp`: files and directories between this machine and a sandbox, streamed both ways. */
import { createReadStream, createWriteStream } from 'node:fs';
import { rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { ConnectionOptions } from '../config.js';
import { isHostdError } from '../errors.js';
import type { Files } from '../files.js';
import { Sandbox } from '../sandbox.js';
import { UsageError, type Command } from './command.js';

export const cp: Command = {
  usage: 'sbx cp SRC DEST',
  summary: 'copy files and directories between this machine and a sandbox',
  details: `  One of SRC and DEST is ID:PATH (an absolute path in sandbox ID), the other a local path.
  A file lands at DEST, or inside DEST when DEST is a directory or ends with '/'.
  A directory's contents land in DEST (created if missing), sent as one tar stream;
  symlinks are copied as links. A local - is stdin or stdout (files only).

  sbx cp data.csv sbx_…:/root/data.csv     sbx cp ./project sbx_…:/root/project
  sbx cp sbx_…:/root/out.png .             sbx cp sbx_…:/root/results ./results`,
  options: {},
  async run(positionals, _values, conn) {
    const [src, dest, ...extra] = positionals;
    if (src === undefined || dest === undefined || extra.length > 0) {
      throw new UsageError('cp needs exactly SRC and DEST', 'cp');
    }
    const from = remoteSpec(src);
    const to = remoteSpec(dest);
    if ((from === undefined) === (to === undefined)) {
      throw new UsageError('exactly one of SRC and DEST must be ID:PATH', 'cp');
    }
    if (to) await upload(src, to, conn);
    else await download(from!, dest, conn);
    return 0;
  },
};

interface RemoteSpec {
  id: string;
  path: string;
}

function remoteSpec(arg: string): RemoteSpec | undefined {
  const m = /^(sbx_[0-9A-Za-z]+):(.+)$/.exec(arg);
  return m ? { id: m[1]!, path: m[2]! } : undefined;
}

async function upload(local: string, to: RemoteSpec, conn: ConnectionOptions): Promise<void> {
  const { files } = await Sandbox.connect(to.id, conn);
  if (local === '-') {
    await files.write(to.path, process.stdin);
    return;
  }
  const st = await stat(local);
  if (st.isDirectory()) {
    await files.uploadDir(local, to.path);
    return;
  }
  const target = (await isRemoteDir(files, to.path))
    ? joinRemote(to.path, basename(local))
    : to.path;
  await files.write(target, createReadStream(local), { mode: st.mode & 0o777 });
}

async function download(from: RemoteSpec, local: string, conn: ConnectionOptions): Promise<void> {
  const { files } = await Sandbox.connect(from.id, conn);
  if (local === '-') {
    await pipeline(await files.readStream(from.path), process.stdout);
    return;
  }
  const entry = await files.stat(from.path);
  if (entry.type === 'dir') {
    await files.downloadDir(from.path, local);
    return;
  }
  const target =
    local.endsWith('/') || (await isLocalDir(local)) ? join(local, basename(from.path)) : local;
  // Written beside the target and renamed when complete, so a failed copy leaves no half file.
  const partial = join(dirname(target), `.${basename(target)}.sbx-partial-${process.pid}`);
  try {
    await pipeline(
      await files.readStream(from.path),
      createWriteStream(partial, { mode: entry.mode & 0o777 }),
    );
    await rename(partial, target);
  } finally {
    await rm(partial, { force: true });
  }
}

async function isRemoteDir(files: Files, path: string): Promise<boolean> {
  if (path.endsWith('/')) return true;
  try {
    return (await files.stat(path)).type === 'dir';
  } catch (err) {
    if (isHostdError(err, 'file_not_found')) return false;
    throw err;
  }
}

async function isLocalDir(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined))?.isDirectory() ?? false;
}

function joinRemote(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, '')}/${name}`;
}
