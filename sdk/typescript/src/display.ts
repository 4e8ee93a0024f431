/**
 * Rich outputs: a `display` event's MIME bundle made convenient (images as bytes, text types as
 * strings), keeping the bundle itself for the types this does not name.
 */
import type { Display, MimeBundle } from './types.js';

const TEXT_FIELDS = [
  ['text', 'text/plain'],
  ['html', 'text/html'],
  ['markdown', 'text/markdown'],
  ['latex', 'text/latex'],
  ['svg', 'image/svg+xml'],
] as const;

const IMAGE_FIELDS = [
  ['png', 'image/png'],
  ['jpeg', 'image/jpeg'],
] as const;

/**
 * The Display of a bundle. A field is set only when the bundle has its MIME type with a value
 * of the documented kind, so a malformed entry is left in `data` rather than guessed at.
 *
 * @example
 * const { displays } = await sandbox.run('plt.plot([1, 2]); plt.show()', { display: true });
 * await writeFile('plot.png', displays[0].png);
 */
export function toDisplay(data: MimeBundle): Display {
  const display: Display = { data };
  for (const [field, mime] of TEXT_FIELDS) {
    const value = data[mime];
    if (typeof value === 'string') display[field] = value;
  }
  for (const [field, mime] of IMAGE_FIELDS) {
    const value = data[mime];
    if (typeof value === 'string') display[field] = Buffer.from(value, 'base64');
  }
  if (Object.hasOwn(data, 'application/json')) display.json = data['application/json'];
  const frame = data['application/vnd.hostd.dataframe+json'];
  if (isObject(frame)) display.dataframe = frame as Record<string, unknown[]>;
  const chart = data['application/vnd.hostd.chart+json'];
  if (isObject(chart)) display.chart = chart;
  return display;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** File extension for a display's image, the first of png, jpeg, svg it has; else undefined. */
export function imageExtension(display: Display): 'png' | 'jpeg' | 'svg' | undefined {
  if (display.png) return 'png';
  if (display.jpeg) return 'jpeg';
  if (display.svg !== undefined) return 'svg';
  return undefined;
}
