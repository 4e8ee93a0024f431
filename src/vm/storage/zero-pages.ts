/**
 * Which pages of a RAM image are known to be all zero without reading them: those inside the
 * image file's holes (lseek's SEEK_HOLE and SEEK_DATA), which read as zero by definition.
 *
 * Why: a pause or a fork copies every page the guest wrote unless it is zero now and zero in the
 * base image too (page-delta.ts keptPages). After a guest drops a cache (a pause's
 * `prepare_pause`), most of its written pages are zero, and learning whether the base's page is
 * zero used to mean reading it: 100 MiB of base reads for the bench's pause (issue 29). A
 * template's image has its zero pages punched out as holes (state-store.ts publishTemplate runs
 * `fallocate --dig-holes`), and a fork point's image is a sparse copy of its base plus the pages
 * copied into it, so the holes are most of its zero pages.
 *
 * Only a hint: a page the map does not know is read as before, and a map that no longer matches
 * the file it was made from (another inode, size or mtime) is not used at all.
 */
import { execFile } from 'node:child_process';
import { existsSync, statSync, type BigIntStats } from 'node:fs';
import { promisify } from 'node:util';
import { fsSyncer } from './durable.js';

const run = promisify(execFile);
const PAGE = 4096;

/**
 * Prints the file's holes as "start end" lines, from lseek's SEEK_DATA (3) and SEEK_HOLE (4),
 * which Linux defines for every filesystem (one without holes reports the whole file as data).
 * Node's fs has no lseek; perl is already how hostd makes the calls Node lacks
 * (vm/host/memory-flags.ts). Exits non-zero on any other error than "no data past here".
 */
const HOLES_SCRIPT = `
open(my $f, "<", $ARGV[0]) or exit 2;
my $end = -s $f; my $pos = 0;
while ($pos < $end) {
  my $d = sysseek($f, $pos, 3);
  if (!defined $d) { exit 3 unless $!{ENXIO}; print "$pos $end\\n"; last }
  print "$pos $d\\n" if $d > $pos;
  my $h = sysseek($f, $d, 4);
  exit 3 unless defined $h && $h > $d;
  $pos = $h;
}
print "end $end\\n";
`;

/** What identifies one version of a file: a map made from it holds while these are the same. */
export interface FileVersion {
  readonly dev: bigint;
  readonly ino: bigint;
  readonly size: bigint;
  readonly mtimeNs: bigint;
}

export function fileVersion(st: BigIntStats): FileVersion {
  return { dev: st.dev, ino: st.ino, size: st.size, mtimeNs: st.mtimeNs };
}

function sameVersion(a: FileVersion, b: FileVersion): boolean {
  return a.dev === b.dev && a.ino === b.ino && a.size === b.size && a.mtimeNs === b.mtimeNs;
}

export class ZeroPages {
  private constructor(
    private readonly bits: Uint8Array,
    /** The version of the file the map was made from. */
    readonly version: FileVersion,
  ) {}

  /**
   * The pages of a file of `version` lying wholly inside one of `holes` ([start, end) byte
   * ranges); a page only partly inside a hole is not known to be zero.
   */
  static fromHoles(
    holes: ReadonlyArray<readonly [number, number]>,
    version: FileVersion,
  ): ZeroPages {
    const pages = Number(version.size / BigInt(PAGE));
    const bits = new Uint8Array(Math.ceil(pages / 8));
    for (const [start, end] of holes) {
      const last = Math.min(Math.floor(end / PAGE), pages);
      for (let p = Math.ceil(start / PAGE); p < last; p++) bits[p >> 3]! |= 1 << (p & 7);
    }
    return new ZeroPages(bits, version);
  }

  /** True if page `page` of the file is known to be all zero. */
  has(page: number): boolean {
    return (
      page >= 0 && page < this.bits.length * 8 && (this.bits[page >> 3]! & (1 << (page & 7))) !== 0
    );
  }

  /** Pages known to be zero. */
  count(): number {
    let n = 0;
    for (const b of this.bits) for (let v = b; v !== 0; v &= v - 1) n++;
    return n;
  }

  /** True if the map was made from the file whose fstat is `st` (as it is now). */
  matches(st: BigIntStats): boolean {
    return sameVersion(this.version, fileVersion(st));
  }
}

/**
 * The holes HOLES_SCRIPT printed, checked: in order, not overlapping, inside the file, and the
 * listing complete (its last line gives the size it walked to). Null if anything is off.
 */
export function parseHoles(text: string, size: number): Array<[number, number]> | null {
  const holes: Array<[number, number]> = [];
  let after = 0;
  const lines = text.split('\n').filter((l) => l !== '');
  if (lines[lines.length - 1] !== `end ${size}`) return null;
  for (const line of lines.slice(0, -1)) {
    const m = /^(\d+) (\d+)$/.exec(line);
    if (!m) return null;
    const start = Number(m[1]);
    const end = Number(m[2]);
    if (!(start >= after && end > start && end <= size)) return null;
    holes.push([start, end]);
    after = end;
  }
  return holes;
}

/**
 * The zero pages of the file at `path` from its holes, or null if they cannot be learned (no
 * perl, a filesystem error, or the file changed while it was walked). The file must not be
 * written any more: an image of a template or a fork point once made.
 */
export async function readZeroPages(
  path: string,
  perl = '/usr/bin/perl',
): Promise<ZeroPages | null> {
  if (!existsSync(perl)) return null;
  // Its pages on disk first: what a filesystem reports of data still in the page cache (delayed
  // allocation) is where lseek's hole reports went wrong before (ext4, years ago). A fork
  // point's image was just written; a template's is synced already.
  await fsSyncer.file(path);
  const before = fileVersion(statSync(path, { bigint: true }));
  const { stdout } = await run(perl, ['-e', HOLES_SCRIPT, path], { maxBuffer: 256 << 20 });
  const after = fileVersion(statSync(path, { bigint: true }));
  if (!sameVersion(before, after)) return null;
  const holes = parseHoles(stdout, Number(after.size));
  return holes ? ZeroPages.fromHoles(holes, after) : null;
}
