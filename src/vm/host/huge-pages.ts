/**
 * Keeps QEMU off transparent huge pages under TCG. QEMU advises huge pages (MADV_HUGEPAGE) for
 * its translation buffer and for every RAM block, so with the host's THP mode at `madvise` (or
 * `always`) each block it touches costs a whole 2 MiB page: a 256 KiB firmware block costs 2 MiB,
 * and the translation buffer is charged in 2 MiB steps. For hundreds of mostly idle VMs that is
 * memory for nothing (docs/architecture.md, Density); small pages cost the emulator little, since TCG's hot data is
 * its TLB, not the buffer's page walks.
 *
 * Node cannot call prctl(2), and PR_SET_THP_DISABLE is inherited across exec: so QEMU is started
 * through perl (perl-base is essential on Debian and starts in a few ms), which sets the flag on
 * itself and execs the rest of the launcher. Not under KVM: there guest RAM on huge pages
 * speeds up the guest's own page walks.
 */
import { existsSync, readFileSync } from 'node:fs';

/** prctl(2)'s syscall number per architecture (perl's `syscall` takes numbers). */
const PRCTL: Partial<Record<NodeJS.Architecture, number>> = { x64: 157, arm64: 167 };
const PR_SET_THP_DISABLE = 41;

/**
 * The argv prefix that starts the rest of the command line with THP disabled, or none when
 * THP is off on this host already, perl is missing, or the architecture is not known here.
 */
export function noHugePagesLauncher(
  arch: NodeJS.Architecture = process.arch,
  thpMode: string = readThpMode(),
  perl = '/usr/bin/perl',
): string[] {
  const nr = PRCTL[arch];
  if (nr === undefined || thpMode === 'never' || !existsSync(perl)) return [];
  return [
    perl,
    '-e',
    `syscall(${nr}, ${PR_SET_THP_DISABLE}, 1, 0, 0, 0) == 0 or die "prctl: $!\\n"; exec { $ARGV[0] } @ARGV or die "exec $ARGV[0]: $!\\n"`,
  ];
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
