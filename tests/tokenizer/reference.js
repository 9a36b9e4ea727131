#!/usr/bin/env node
// Reference outputs of the Hugging Face `tokenizers` library (its Node binding,
// @anush008/tokenizers) for the tokenizer parity test. One process per tokenizer, whole file.
//
// usage: node reference.js NODE_MODULES MODE TOKENIZER_JSON IN OUT [IDS_IN IDS_OUT]
//   MODE encode: IN has JSON lines {"text": ...}; OUT gets one line per input:
//     {"ids": [...], "ids_plain": [...], "decode": "...", "decode_skip": "...",
//      "decode_plain": "...", "decode_plain_skip": "..."}
//     ids: encode with special tokens added; ids_plain: without; decode / decode_skip: the decode
//     of `ids` with skip_special_tokens false / true; decode_plain*: the same for `ids_plain`.
//     A line the library refuses gets {"error": ...}. With IDS_IN and IDS_OUT it also does what
//     MODE decode does with them, in the same process.
//   MODE decode: IN has JSON lines {"ids": [...]}; OUT gets {"text": ..., "text_skip": ...}.
//   MODE load: only loads TOKENIZER_JSON (IN and OUT are ignored).
// Every mode prints {"vocab_size": N} (added tokens included) on stdout once the tokenizer has
// loaded; a file the library refuses makes it exit 1 with the library's error.
'use strict';

const fs = require('fs');
const path = require('path');

function readJsonLines(file) {
  const text = fs.readFileSync(file, 'utf8');
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines.map((l) => JSON.parse(l));
}

async function decodeAll(tok, rows) {
  const out = [];
  for (const row of rows) {
    try {
      const text = await tok.decode(row.ids, false);
      const textSkip = await tok.decode(row.ids, true);
      out.push(JSON.stringify({text, text_skip: textSkip}));
    } catch (e) {
      out.push(JSON.stringify({error: String(e)}));
    }
  }
  return out.length ? out.join('\n') + '\n' : '';
}

async function main(argv) {
  if (argv.length !== 5 && !(argv.length === 7 && argv[1] === 'encode')) {
    process.stderr.write('usage: node reference.js NODE_MODULES encode|decode|load TOKENIZER_JSON IN OUT [IDS_IN IDS_OUT]\n');
    return 2;
  }
  const [modules, mode, tokenizerPath, input, output, idsInput, idsOutput] = argv;
  const {Tokenizer} = require(path.join(path.resolve(modules), '@anush008', 'tokenizers'));
  const tok = Tokenizer.fromFile(tokenizerPath);
  if (mode === 'load') {
    process.stdout.write(JSON.stringify({vocab_size: tok.getVocabSize(true)}) + '\n');
    return 0;
  }
  // Every mode says how many ids the tokenizer has (added tokens included).
  process.stdout.write(JSON.stringify({vocab_size: tok.getVocabSize(true)}) + '\n');
  const rows = readJsonLines(input);
  const out = [];
  if (mode === 'encode') {
    for (const row of rows) {
      try {
        const ids = (await tok.encode(row.text, null, {addSpecialTokens: true})).getIds();
        const plain = (await tok.encode(row.text, null, {addSpecialTokens: false})).getIds();
        const decode = await tok.decode(ids, false);
        const decodeSkip = await tok.decode(ids, true);
        const decodePlain = await tok.decode(plain, false);
        const decodePlainSkip = await tok.decode(plain, true);
        out.push(JSON.stringify({ids, ids_plain: plain, decode, decode_skip: decodeSkip,
                                 decode_plain: decodePlain, decode_plain_skip: decodePlainSkip}));
      } catch (e) {
        out.push(JSON.stringify({error: String(e)}));
      }
    }
    if (idsInput) {
      fs.writeFileSync(idsOutput, await decodeAll(tok, readJsonLines(idsInput)));
    }
  } else if (mode === 'decode') {
    fs.writeFileSync(output, await decodeAll(tok, rows));
    return 0;
  } else {
    process.stderr.write(`unknown mode ${mode}\n`);
    return 2;
  }
  fs.writeFileSync(output, out.length ? out.join('\n') + '\n' : '');
  return 0;
}

main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; }, (e) => {
  process.stderr.write(`reference.js: ${e && e.stack ? e.stack : e}\n`);
  process.exitCode = 1;
});
