/**
 * Sets per-process memory flags on QEMU before it starts, through prctl(2): flags that are
 * inherited across exec, so a one-line perl launcher sets them on itself and execs the rest of
 * the command line (Node cannot call prctl; perl-base is essential on Debian and starts in a few
 * ms).
 *
 * - No transparent huge pages under TCG (PR_SET_THP_DISABLE). QEMU advises huge pages
 *   (MADV_HUGEPAGE) for its translation buffer and for every RAM block, so with the host's THP
 *   mode at `madvise` (or `always`) each block it touches costs a whole 2 MiB page: a 256 KiB
 *   firmware block costs 2 MiB, and the translation buffer is charged in 2 MiB steps. For
 *   hundreds of mostly idle VMs that is memory for nothing (docs/architecture.md, Density);
 *   small pages cost the emulator little, since TCG's hot data is its TLB, not the buffer's
 *   page walks. Not under KVM: there guest RAM on huge pages speeds up the guest's own page walks.
 * - KSM over all of QEMU's anonymous memory (PR_SET_MEMORY_MERGE, Linux 6.4; kept across exec
 *   since 6.7), not only the guest RAM QEMU marks mergeable itself: QEMU's heap, its arenas and
 *   TCG's soft TLBs hold many pages that every VM fills alike (docs/architecture.md, Density).
 *   A kernel without it refuses the call (EINVAL): the launcher goes on without, since it only
 *   costs memory.
 */
import { existsSync, readFileSync } from 'node:fs';

/** prctl(2)'s syscall number per architecture (perl's `syscall` takes numbers). */
const PRCTL: Partial<Record<NodeJS.Architecture, number>> = { x64: 157, arm64: 167 };
const PR_SET_THP_DISABLE = 41;
const PR_SET_MEMORY_MERGE = 67;

/** The flags QEMU should start with. */
export interface MemoryFlags {
  /** No transparent huge pages (TCG: vm/host/memory-flags.ts). */
  readonly noHugePages: boolean;
  /** KSM may merge every anonymous page of QEMU, not only guest RAM. */
  readonly mergeAll: boolean;
}

/**
 * The argv prefix that starts the rest of the command line with `flags` set, or none when
 * nothing is to be set, perl is missing, or the architecture is not known here. THP is not
 * disabled when the host's THP mode is `never` already.
 *
 * @example
 * memoryFlagsLauncher({ noHugePages: true, mergeAll: false }, 'x64', 'madvise')
 * // ['/usr/bin/perl', '-e', 'syscall(157, 41, 1, 0, 0, 0) == 0 or die ...; exec ...']
 */
export function memoryFlagsLauncher(
  flags: MemoryFlags,
  arch: NodeJS.Architecture = process.arch,
  thpMode: string = readThpMode(),
  perl = '/usr/bin/perl',
): string[] {
  const nr = PRCTL[arch];
  const noThp = flags.noHugePages && thpMode !== 'never';
  if (nr === undefined || (!noThp && !flags.mergeAll) || !existsSync(perl)) return [];
  const steps = [
    ...(noThp
      ? [`syscall(${nr}, ${PR_SET_THP_DISABLE}, 1, 0, 0, 0) == 0 or die "prctl: $!\\n"`]
      : []),
    ...(flags.mergeAll ? [`syscall(${nr}, ${PR_SET_MEMORY_MERGE}, 1, 0, 0, 0)`] : []),
    `exec { $ARGV[0] } @ARGV or die "exec $ARGV[0]: $!\\n"`,
  ];
  return [perl, '-e', steps.join('; ')];
}

/** The host's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled. */
function readThpMode(): string {
  try {
    const text = readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');
    return /\[(\w+)\]/.exec(text)?.[1] ?? 'never';
  } catch {
    // Expected: a kernel built without transparent huge pages has no such file.
    return 'never';
  }
}
