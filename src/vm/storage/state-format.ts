/**
 * The version of what hostd writes to disk about machines (frozen states, paused machines):
 * bumped whenever their content, or how they are restored, changes, so that a hostd never
 * restores what it does not understand. 2: states and paused machines have a writable disk.
 */
export const STATE_FORMAT = 2;
