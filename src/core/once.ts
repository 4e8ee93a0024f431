/**
 * A release that may be called more than once but acts once: the reservations of admission
 * (admission.ts, copy-room.ts) and the turn of a serial queue (serial-queue.ts) hand their caller
 * a release that error paths and `finally` blocks may both reach, and a second call must not give
 * the room or the turn back twice.
 */
export function once(act: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    act();
  };
}
