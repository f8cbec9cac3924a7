// A process detector plugin for cacheprune (protocol v2, see
// engine/detect/detect_plugin_abi.h) over the compromise NLP library:
// people, places and organisations in free text.  One process answers many
// messages: each stdin line {"id":N,"text":"...","role":"..."} gets exactly
// one stdout line {"id":N,"spans":[{"start","end","type","score"}]}.
//
// Offsets: compromise counts UTF-16 code units (JavaScript string indices);
// the engine wants UTF-8 bytes, so each span is converted here.  A request
// that is not JSON gets a reply without an id, which the engine refuses:
// the message fails closed at once instead of waiting for a timeout.
//
// run: cacheprune detect --plugin-cmd "node plugins/ner/ner.mjs" TEXT
import nlp from 'compromise';
import { createInterface } from 'node:readline';

const KINDS = [
  ['person', (d) => d.people()],
  ['location', (d) => d.places()],
  ['org', (d) => d.organizations()],
];

// letters and digits (any script): a span is trimmed to start and end on one
const WORDY = /[\p{L}\p{N}\p{M}]/u;

// UTF-8 byte offset of every UTF-16 index of s (length s.length + 1)
function byteOffsets(s) {
  const off = new Uint32Array(s.length + 1);
  let b = 0;
  for (let i = 0; i < s.length; ) {
    const cp = s.codePointAt(i);
    const units = cp > 0xffff ? 2 : 1;
    const bytes = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (let k = 0; k < units; k++) off[i + k] = b;
    b += bytes;
    i += units;
  }
  off[s.length] = b;
  return off;
}

function charAt(s, i) {
  const cp = s.codePointAt(i);
  return String.fromCodePoint(cp);
}

function spansOf(text) {
  const doc = nlp(text);
  let off = null;
  const spans = [];
  for (const [type, pick] of KINDS) {
    for (const m of pick(doc).json({ offset: true })) {
      if (!m.offset) continue;
      // clamped, not dropped: compromise's length runs past the text's end
      // when the term ends in a character outside the BMP ("😀john smith😀":
      // start 2, length 14 of 14 units), and dropping the span shared the name
      let a = Math.max(0, m.offset.start), e = Math.min(text.length, m.offset.start + m.offset.length);
      if (!(a < e)) continue;
      // compromise's offsets may take in the punctuation around a term
      while (a < e && !WORDY.test(charAt(text, a))) a += text.codePointAt(a) > 0xffff ? 2 : 1;
      // and may run on past a closing bracket the term never opened
      // ("(my name is Nils Nakamura) But": "Nils Nakamura) But"): cut there
      const close = text.slice(a, e).search(/[)\]}]/);
      if (close >= 0 && !/[([{]/.test(text.slice(a, a + close))) e = a + close;
      while (e > a && !WORDY.test(text[e - 1]) && !(e - 2 >= a && WORDY.test(charAt(text, e - 2)) && text.codePointAt(e - 2) > 0xffff)) e--;
      if (a >= e) continue;
      off ??= byteOffsets(text);
      spans.push({ start: off[a], end: off[e], type, score: 0.7 });
    }
  }
  return spans;
}

// Warm-up before the first request is read: V8 optimises compromise's
// tagger only after many calls, and an engine sends a few messages a
// request, so without it the first hundreds of messages ran ~1.5x slower
// (rag-v1's 60 requests on 2 cores: 4.4 -> 2.9 ms a message on average).
// The engine waits for the first answer longer than this takes (~0.6 s).
const WARM_UP = [
  'Hello, my name is Jane Porter and I moved from Leeds to Lisbon with my brother Tom.',
  'Could you ask Dr. Omar Haddad at the Northwind Trading Company to call me before Friday?',
  'What is the main point the second passage makes, and does the third one agree with it?',
  "'We shall see,' said the Duchess, walking slowly towards the garden gate of the old house.",
  'Our team in Osaka met the board of Blue River Bank on Monday; minutes follow below.',
];
for (let i = 0; i < 300; i++) spansOf(WARM_UP[i % WARM_UP.length]);

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    process.stdout.write('{"error":"request is not JSON"}\n');
    return;
  }
  if (typeof req.id !== 'number' || typeof req.text !== 'string') {
    process.stdout.write('{"error":"request needs a numeric id and a text"}\n');
    return;
  }
  let spans;
  try {
    spans = spansOf(req.text);
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: 'ner failed' }) + '\n'); // no id: fails closed
    return;
  }
  process.stdout.write(JSON.stringify({ id: req.id, spans }) + '\n');
});
