#!/usr/bin/env node
// The Hugging Face `tokenizers` library (its Node binding, @anush008/tokenizers) as a line
// server for the cluster text test (cluster_text.py): one tokenizer loaded once, then one JSON
// request per stdin line and one JSON answer per stdout line, in order.
//
// usage: node cluster_reference.js NODE_MODULES TOKENIZER_JSON
//   {"encode": TEXT, "add_special_tokens": BOOL}  ->  {"ids": [...]}
//   {"decode": [IDS], "skip_special_tokens": BOOL}  ->  {"text": TEXT}
//   anything the library refuses                   ->  {"error": MESSAGE}
// The first line written, once the tokenizer has loaded, is {"vocab_size": N}.
'use strict';

const path = require('path');
const readline = require('readline');

async function answer(tok, request) {
  if (typeof request.encode === 'string') {
    const encoding = await tok.encode(request.encode, null,
                                      {addSpecialTokens: request.add_special_tokens !== false});
    return {ids: encoding.getIds()};
  }
  if (Array.isArray(request.decode)) {
    return {text: await tok.decode(request.decode, request.skip_special_tokens === true)};
  }
  return {error: 'a request needs "encode" (a string) or "decode" (a list of ids)'};
}

async function main(argv) {
  if (argv.length !== 2) {
    process.stderr.write('usage: node cluster_reference.js NODE_MODULES TOKENIZER_JSON\n');
    return 2;
  }
  const [modules, tokenizerPath] = argv;
  const {Tokenizer} = require(path.join(path.resolve(modules), '@anush008', 'tokenizers'));
  const tok = Tokenizer.fromFile(tokenizerPath);
  process.stdout.write(JSON.stringify({vocab_size: tok.getVocabSize(true)}) + '\n');
  const lines = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
  for await (const line of lines) {
    let out;
    try {
      out = await answer(tok, JSON.parse(line));
    } catch (e) {
      out = {error: String(e)};
    }
    process.stdout.write(JSON.stringify(out) + '\n');
  }
  return 0;
}

main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; }, (e) => {
  process.stderr.write(`cluster_reference.js: ${e && e.stack ? e.stack : e}\n`);
  process.exitCode = 1;
});
