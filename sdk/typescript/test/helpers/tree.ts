/** Local directory trees for the files tests: made from a description, read back into one. */
import {
  chmod,
  lstat,
  mkdir,
  readFile,
  readdir,
  readlink,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { dirname, join } from 'node:path';

export type Node =
  | { type: 'file'; content: string; mode: number }
  | { type: 'dir' }
  | { type: 'symlink'; target: string };

/** Relative `/`-separated path to what is there. */
export type Tree = Record<string, Node>;

export async function makeTree(root: string, tree: Tree): Promise<void> {
  await mkdir(root, { recursive: true });
  for (const [path, node] of Object.entries(tree)) {
    const abs = join(root, ...path.split('/'));
    await mkdir(dirname(abs), { recursive: true });
    if (node.type === 'dir') await mkdir(abs, { recursive: true });
    else if (node.type === 'symlink') await symlink(node.target, abs);
    else {
      await writeFile(abs, node.content);
      await chmod(abs, node.mode);
    }
  }
}

export async function readTree(root: string, prefix = ''): Promise<Tree> {
  const tree: Tree = {};
  for (const name of (await readdir(join(root, prefix))).sort()) {
    const path = prefix === '' ? name : `${prefix}/${name}`;
    const abs = join(root, path);
    const st = await lstat(abs);
    if (st.isSymbolicLink()) tree[path] = { type: 'symlink', target: await readlink(abs) };
    else if (st.isDirectory()) {
      tree[path] = { type: 'dir' };
      Object.assign(tree, await readTree(root, path));
    } else {
      tree[path] = { type: 'file', content: await readFile(abs, 'utf8'), mode: st.mode & 0o777 };
    }
  }
  return tree;
}

/** A tree with what tars find hard: nesting, an empty directory and an empty file, names over
 * 100 bytes, non-ASCII names, a symlink, an executable. */
export function awkwardTree(): Tree {
  const long = `${'d'.repeat(60)}/${'e'.repeat(60)}/${'f'.repeat(80)}.txt`;
  return {
    'a.txt': { type: 'file', content: 'alpha\n', mode: 0o644 },
    'empty.txt': { type: 'file', content: '', mode: 0o600 },
    'run.sh': { type: 'file', content: '#!/bin/sh\necho hi\n', mode: 0o755 },
    'sub/deeper/b.bin': { type: 'file', content: 'x'.repeat(70_000), mode: 0o644 },
    'sub/deeper': { type: 'dir' },
    sub: { type: 'dir' },
    void: { type: 'dir' },
    'ünïcödé ñame.txt': { type: 'file', content: 'utf-8 name\n', mode: 0o644 },
    [long]: { type: 'file', content: 'long name\n', mode: 0o644 },
    [long.split('/').slice(0, 2).join('/')]: { type: 'dir' },
    [long.split('/')[0]!]: { type: 'dir' },
    link: { type: 'symlink', target: 'sub/deeper/b.bin' },
  };
}
