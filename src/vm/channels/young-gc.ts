/**
 * Bounds the garbage large file transfers leave behind. Every socket read is a fresh 64 KiB
 * buffer that is garbage once written out, and V8 collects such buffers only when its external
 * memory limit (64 MiB above the last collection) is reached, and a large download grew hostd
 * by tens of MiB. A minor collection every 8 MiB a transfer moves frees them at once, for a
 * scavenge of a few ms that left transfers as fast (docs/architecture.md, "Measured choices in the code").
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** Bytes moved between two minor collections. */
export const YOUNG_GC_EVERY_BYTES = 8 * 1024 * 1024;

type GcFunction = (options: { type: 'minor' }) => void;

let collect: GcFunction | null | undefined;

/** V8's own `gc`, exposed in a fresh context only: hostd's global scope stays as it was. */
function gcFunction(): GcFunction | null {
  if (collect === undefined) {
    try {
      setFlagsFromString('--expose-gc');
      collect = runInNewContext('gc') as GcFunction;
    } catch {
      // Expected on a V8 that refuses the flag at run time: collections are then V8's own.
      collect = null;
    }
  }
  return collect;
}

/** Whether this Node lets hostd run minor collections (a unit test holds upgrades to it). */
export function youngGcAvailable(): boolean {
  return gcFunction() !== null;
}

/** Counts bytes moved and runs a minor collection each YOUNG_GC_EVERY_BYTES. */
export class YoungGcPacer {
  private moved = 0;

  constructor(
    private readonly every = YOUNG_GC_EVERY_BYTES,
    private readonly collectYoung: () => void = () => gcFunction()?.({ type: 'minor' }),
  ) {}

  add(bytes: number): void {
    this.moved += bytes;
    if (this.moved < this.every) return;
    this.moved = 0;
    this.collectYoung();
  }
}

/**
 * The one pacer of every transfer, file or relayed connection: the garbage is the process's,
 * whichever transfer made it, so ten concurrent 7 MiB transfers collect as one 70 MiB
 * transfer does.
 */
export const transferGc = new YoungGcPacer();
