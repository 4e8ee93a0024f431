/**
 * What a model sees of an exec: its output and rich displays as MCP content blocks, in the order
 * a notebook shows them, within limits that keep one tool result from flooding the model's
 * context. Images stay images (a model can look at a chart), a DataFrame is its text table for
 * the model with its HTML form for a host that renders it, and output past the limit is cut in
 * the middle, where it matters least: the start says what the code began doing, the end holds
 * the result or the traceback.
 */
import type { ContentBlock } from '@modelcontextprotocol/sdk/types.js';
import type { MimeBundle } from '../types.js';

/** Characters of text one tool result carries by default (about 8k tokens). */
export const DEFAULT_MAX_OUTPUT_CHARS = 30_000;

/** Images one result carries; more are counted in a note (each costs the model ~1.5k tokens). */
export const MAX_IMAGES = 10;

/** Raster types a model can look at, most preferred first. */
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'] as const;

/**
 * Collects one exec's output and displays as content blocks. Text goes in as it arrives; past
 * half the budget, further text goes to a tail that keeps only the last half, and `finish`
 * puts a note of what was left out between the two.
 */
export class RunContent {
  readonly #max: number;
  readonly #where: string;
  readonly #blocks: ContentBlock[] = [];
  /** Displays that came once the head was full: shown after the tail. */
  readonly #late: ContentBlock[] = [];
  #text = '';
  #headLeft: number;
  #tail: string[] = [];
  #tailLength = 0;
  readonly #tailMax: number;
  #cut = false;
  #omitted = 0;
  #images = 0;
  #imagesOmitted = 0;
  #displays = 0;
  #anyOutput = false;

  /**
   * @param maxChars the text budget of the whole result
   * @param where the sandbox, for the URIs of embedded HTML (`hostd://sandbox/ID/display/N`)
   */
  constructor(maxChars: number, where: string) {
    this.#max = maxChars;
    this.#where = where;
    this.#headLeft = Math.ceil(maxChars / 2);
    this.#tailMax = maxChars - this.#headLeft;
  }

  /** A piece of stdout or stderr, newlines included. */
  text(piece: string): void {
    if (piece === '') return;
    this.#anyOutput = true;
    if (!this.#cut) {
      if (piece.length <= this.#headLeft) {
        this.#text += piece;
        this.#headLeft -= piece.length;
        return;
      }
      this.#text += piece.slice(0, this.#headLeft);
      piece = piece.slice(this.#headLeft);
      this.#headLeft = 0;
      this.#cut = true;
    }
    this.#tail.push(piece);
    this.#tailLength += piece.length;
    while (this.#tailLength > this.#tailMax) {
      const excess = this.#tailLength - this.#tailMax;
      const first = this.#tail[0]!;
      if (first.length <= excess) {
        this.#tail.shift();
        this.#tailLength -= first.length;
        this.#omitted += first.length;
      } else {
        this.#tail[0] = first.slice(excess);
        this.#tailLength -= excess;
        this.#omitted += excess;
      }
    }
  }

  /** A rich output (`display` event). */
  display(bundle: MimeBundle): void {
    this.#anyOutput = true;
    this.#displays += 1;
    const blocks: ContentBlock[] = [];
    const image = IMAGE_TYPES.find((type) => typeof bundle[type] === 'string');
    if (image !== undefined) {
      if (this.#images < MAX_IMAGES) {
        this.#images += 1;
        blocks.push({ type: 'image', data: bundle[image] as string, mimeType: image });
      } else {
        this.#imagesOmitted += 1;
      }
    } else {
      const text = displayText(bundle);
      if (text !== undefined) blocks.push({ type: 'text', text: this.#fit(text) });
      const html = bundle['text/html'];
      const svg = bundle['image/svg+xml'];
      // HTML (a DataFrame's table) and SVG are for a host to render; the model reads the text.
      if (typeof html === 'string' && html.length <= this.#max) {
        blocks.push(this.#resource('html', 'text/html', html));
      } else if (typeof svg === 'string' && svg.length <= this.#max) {
        blocks.push(this.#resource('svg', 'image/svg+xml', svg));
      }
    }
    if (this.#cut) {
      this.#late.push(...blocks);
    } else {
      this.#flush();
      this.#blocks.push(...blocks);
    }
  }

  /** True once any output or display arrived. */
  get anyOutput(): boolean {
    return this.#anyOutput;
  }

  /** The blocks, with notes of what the limits left out and `status` last. */
  finish(status: string): ContentBlock[] {
    if (this.#cut && this.#omitted === 0) {
      // The tail never overflowed: everything fits, only split in two.
      this.#text += this.#tail.join('');
    } else if (this.#cut) {
      this.#text += `\n[... ${this.#omitted} characters of output omitted here: a result holds at most ${this.#max}. Print less, or write the output to a file and read it in parts with read_file ...]\n`;
      this.#text += this.#tail.join('');
    }
    this.#flush();
    this.#blocks.push(...this.#late);
    const notes: string[] = [];
    if (this.#imagesOmitted > 0) {
      notes.push(
        `[${this.#imagesOmitted} more image(s) not shown: a result holds at most ${MAX_IMAGES}; save figures to files instead]`,
      );
    }
    notes.push(status);
    this.#blocks.push({ type: 'text', text: notes.join('\n') });
    return this.#blocks;
  }

  #flush(): void {
    if (this.#text !== '') this.#blocks.push({ type: 'text', text: this.#text });
    this.#text = '';
  }

  /** Display text counts against the head's budget, so many DataFrames cannot flood a result. */
  #fit(text: string): string {
    if (text.length <= this.#headLeft) {
      this.#headLeft -= text.length;
      return text;
    }
    const kept = text.slice(0, Math.max(this.#headLeft, 200));
    this.#headLeft = Math.max(0, this.#headLeft - kept.length);
    return `${kept}\n[... display cut: ${text.length - kept.length} more characters]`;
  }

  #resource(kind: string, mimeType: string, text: string): ContentBlock {
    return {
      type: 'resource',
      resource: {
        uri: `hostd://sandbox/${this.#where}/display/${this.#displays}.${kind}`,
        mimeType,
        text,
      },
      annotations: { audience: ['user'] },
    };
  }
}

/** The text a model reads for a display without an image: the richest text form it has. */
function displayText(bundle: MimeBundle): string | undefined {
  for (const type of ['text/markdown', 'text/latex', 'text/plain']) {
    const value = bundle[type];
    if (typeof value === 'string') return value;
  }
  if (Object.hasOwn(bundle, 'application/json')) {
    return JSON.stringify(bundle['application/json'], null, 2);
  }
  return undefined;
}

/** Cuts `text` to `max` characters with a note of how much was left out. */
export function clip(text: string, max: number, hint = ''): string {
  if (text.length <= max) return text;
  return `${text.slice(0, max)}\n[... ${text.length - max} more characters not shown${hint}]`;
}

/** The MIME type of an image file by its first bytes, when it is one a model can look at. */
export function sniffImage(bytes: Uint8Array): (typeof IMAGE_TYPES)[number] | undefined {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, 12));
  if (b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) {
    return 'image/png';
  }
  if (b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return 'image/jpeg';
  if (b.subarray(0, 4).toString('latin1') === 'GIF8') return 'image/gif';
  if (
    b.subarray(0, 4).toString('latin1') === 'RIFF' &&
    b.subarray(8, 12).toString('latin1') === 'WEBP'
  ) {
    return 'image/webp';
  }
  return undefined;
}

/**
 * Whether bytes read as text: valid UTF-8 (a sequence cut at the end is fine) without NUL
 * bytes, which text files do not have and binary formats almost always do.
 */
export function looksLikeText(bytes: Uint8Array): boolean {
  if (bytes.includes(0)) return false;
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(bytes, { stream: true });
    return true;
  } catch {
    return false;
  }
}
