// The oracle of the C++ tokenizer (engine/tokenizer.cpp): js-tiktoken's o200k_base ranks (checked
// against the official o200k_base.tiktoken's sha256) with the o200k_harmony special tokens.
//
//   node oracle.mjs tokenizer-json OUT.json     write a Hugging Face tokenizer.json built from the
//                                               ranks (the layout the hub's openai/gpt-oss-20b ships)
//   node oracle.mjs encode CORPUS               one JSON array of ids per case, specials as text
//   node oracle.mjs encode-special CORPUS       the same with every special token allowed
//   node oracle.mjs decode IDS.jsonl            one JSON string per line of ids: the decoded text
//   node oracle.mjs random CORPUS N SEED        N random texts made of the corpus's characters
//                                               (more spaces, newlines, apostrophes and digits),
//                                               one {"text", "ids"} per line, specials as text
//
// CORPUS: one case per line, a JSON string (so that tabs, newlines and trailing spaces are
// visible); blank lines and lines starting with # are skipped. After the cases, one more text is
// encoded: every case joined by "\n" (tests/tokenizer_test.cpp does the same).
import { createHash } from "node:crypto";
import fs from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import o200k_base from "js-tiktoken/ranks/o200k_base";

// sha256 of openai's o200k_base.tiktoken (gpt-oss spec, section 5): the ranks below must be it.
const O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";

// The o200k pattern as tiktoken and the hub's tokenizer.json write it. js-tiktoken spells the
// case-insensitive contractions out ('s|'S|...) because JavaScript has no inline (?i:...).
const O200K_PATTERN = [
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "\\p{N}{1,3}",
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
  "\\s*[\\r\\n]+",
  "\\s+(?!\\S)",
  "\\s+",
].join("|");

// o200k_harmony's special tokens (openai/harmony public_encodings.rs; tiktoken's o200k_harmony):
// 199998..200013 named or reserved, 200018 o200k_base's <|endofprompt|> (as the hub's
// tokenizer.json has it), everything else up to the model's last row (201087) <|reserved_N|>.
const FIRST_SPECIAL = 199998;
const LAST_SPECIAL = 201087;
const NAMED_SPECIALS = {
  199998: "<|startoftext|>",
  199999: "<|endoftext|>",
  200002: "<|return|>",
  200003: "<|constrain|>",
  200005: "<|channel|>",
  200006: "<|start|>",
  200007: "<|end|>",
  200008: "<|message|>",
  200012: "<|call|>",
  200018: "<|endofprompt|>",
};
function harmonySpecials() {
  const specials = {};
  for (let id = FIRST_SPECIAL; id <= LAST_SPECIAL; ++id)
    specials[NAMED_SPECIALS[id] ?? `<|reserved_${id}|>`] = id;
  return specials;
}

function die(message) {
  process.stderr.write(`tokenizer oracle: ${message}\n`);
  process.exit(2);
}

// js-tiktoken's ranks, checked: contiguous 0..n-1, and the .tiktoken file they make ("base64 rank"
// lines in rank order) has the official sha256.
function loadEncoder() {
  const enc = new Tiktoken(o200k_base, harmonySpecials());
  const ranks = enc.textMap; // rank -> Uint8Array
  const n = ranks.size;
  const hash = createHash("sha256");
  for (let r = 0; r < n; ++r) {
    const bytes = ranks.get(r);
    if (bytes === undefined) die(`js-tiktoken's o200k_base has no rank ${r} of ${n}`);
    hash.update(`${Buffer.from(bytes).toString("base64")} ${r}\n`);
  }
  const sha = hash.digest("hex");
  if (sha !== O200K_BASE_SHA256)
    die(`js-tiktoken's o200k_base ranks hash to ${sha}, not o200k_base.tiktoken's ${O200K_BASE_SHA256}`);
  if (n !== FIRST_SPECIAL) die(`o200k_base has ${n} ranks, expected ${FIRST_SPECIAL}`);
  return { enc, ranks, n };
}

// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the others (controls,
// space, 0x7f-0xa0, 0xad) for U+0100 onwards in byte order.
function byteToUnicode() {
  const table = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table[b] = String.fromCodePoint(printable ? b : next++);
  }
  return table;
}

// Byte-pair merging of `bytes` as tiktoken does it (lowest rank first, leftmost on a tie), using
// only merges of rank below `maxRank`: replaying a token's own bytes this way ends in the two
// tokens whose merge makes it (the merges of a BPE that reaches it are all of lower rank).
function replay(bytes, rankOf, maxRank) {
  let parts = Array.from(bytes, (b) => String.fromCharCode(b));
  for (;;) {
    let best = -1;
    let bestRank = maxRank;
    for (let i = 0; i + 1 < parts.length; ++i) {
      const r = rankOf.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) return parts;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
  }
}

function writeTokenizerJson(out) {
  const { ranks, n } = loadEncoder();
  const b2u = byteToUnicode();
  const latin1 = (bytes) => Array.from(bytes, (b) => String.fromCharCode(b)).join("");
  const byteLevel = (s) => Array.from(s, (c) => b2u[c.charCodeAt(0)]).join("");
  const rankOf = new Map();
  for (let r = 0; r < n; ++r) rankOf.set(latin1(ranks.get(r)), r);

  const vocab = {};
  const merges = [];
  const unreachable = [];
  for (let r = 0; r < n; ++r) {
    const token = latin1(ranks.get(r));
    vocab[byteLevel(token)] = r;
    if (token.length < 2) continue;
    const parts = replay(ranks.get(r), rankOf, r);
    if (parts.length === 2) merges.push([byteLevel(parts[0]), byteLevel(parts[1])]);
    else unreachable.push(r); // BPE never makes it; only a whole-piece match emits it
  }
  const added = [];
  for (const [content, id] of Object.entries(harmonySpecials()))
    added.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  added.sort((a, b) => a.id - b.id);

  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: O200K_PATTERN }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: true,
      vocab,
      merges,
    },
  };
  const tmp = `${out}.partial`;
  fs.writeFileSync(tmp, JSON.stringify(json, null, 1) + "\n");
  fs.renameSync(tmp, out);
  process.stderr.write(
    `tokenizer oracle: wrote ${out}: ${n} ranks, ${merges.length} merges, ${added.length} special tokens` +
      ` (${unreachable.length} ranks no merge reaches: ${unreachable.slice(0, 8).join(" ")}${unreachable.length > 8 ? " ..." : ""})\n`,
  );
}

function readCorpus(path) {
  const cases = [];
  fs.readFileSync(path, "utf8")
    .split("\n")
    .forEach((line, i) => {
      if (line.trim() === "" || line.startsWith("#")) return;
      let text;
      try {
        text = JSON.parse(line);
      } catch (e) {
        die(`${path}:${i + 1}: not a JSON string (${e.message})`);
      }
      if (typeof text !== "string") die(`${path}:${i + 1}: not a JSON string`);
      cases.push(text);
    });
  if (cases.length === 0) die(`${path}: no cases`);
  cases.push(cases.join("\n"));
  return cases;
}

function encode(corpus, allowSpecial) {
  const { enc } = loadEncoder();
  const lines = readCorpus(corpus).map((text) =>
    JSON.stringify(allowSpecial ? enc.encode(text, "all") : enc.encode(text, [], [])),
  );
  process.stdout.write(lines.join("\n") + "\n");
}

function decode(idsFile) {
  const { enc } = loadEncoder();
  const lines = fs
    .readFileSync(idsFile, "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.stringify(enc.decode(JSON.parse(l))));
  process.stdout.write(lines.join("\n") + "\n");
}

// Random texts over the corpus's own characters (so none of the characters the corpus leaves out),
// from a fixed seed: the same texts on every machine.
function random(corpus, count, seed) {
  const { enc } = loadEncoder();
  const cases = readCorpus(corpus);
  const pool = [...new Set(Array.from(cases.join("")))];
  const extra = [" ", " ", " ", "  ", "\n", "\n\n", "'", "'s", "'LL", "0", "7", "42", "\t", " \n"];
  let state = BigInt(seed) | 1n;
  const next = (n) => {
    // xorshift64*: a fixed sequence, no dependence on the platform's Math.random
    state ^= state >> 12n;
    state ^= (state << 25n) & 0xffffffffffffffffn;
    state ^= state >> 27n;
    return Number(((state * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 33n) % n;
  };
  const lines = [];
  for (let i = 0; i < count; ++i) {
    const length = 1 + next(40);
    let text = "";
    for (let k = 0; k < length; ++k) text += next(4) === 0 ? extra[next(extra.length)] : pool[next(pool.length)];
    lines.push(JSON.stringify({ text, ids: enc.encode(text, [], []) }));
  }
  process.stdout.write(lines.join("\n") + "\n");
}

const [mode, arg, ...rest] = process.argv.slice(2);
if (!arg)
  die("usage: oracle.mjs tokenizer-json OUT | encode CORPUS | encode-special CORPUS | decode IDS.jsonl | random CORPUS N SEED");
if (mode === "tokenizer-json") writeTokenizerJson(arg);
else if (mode === "encode") encode(arg, false);
else if (mode === "encode-special") encode(arg, true);
else if (mode === "decode") decode(arg);
else if (mode === "random") random(arg, Number(rest[0] ?? 2000), Number(rest[1] ?? 1));
else die(`unknown mode ${JSON.stringify(mode)}`);
