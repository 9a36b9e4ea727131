#!/usr/bin/env node
// The Hugging Face `tokenizers` library's side of bench/tokenizer_bench.py: single-thread encode
// and decode throughput of one tokenizer over whole documents, measured the way
// carpool-bench-tokenizer measures carpool (a warm-up pass, then the best of N timed passes).
//
// usage: node tokenizer_reference_bench.js NODE_MODULES TOKENIZER_JSON DOCS.jsonl PASSES IDS_OUT
//   DOCS.jsonl: JSON lines {"text": ...}. IDS_OUT gets {"ids": [...], "text": decode} per document.
//   Prints one JSON line: {"documents", "bytes", "tokens", "load_s", "encode_s", "decode_s", ...}.
//
// What is timed: `await tok.encode(doc, null, {addSpecialTokens: false})` for each document (the
// Encoding's getIds() is called outside the timed span), and `await tok.decode(ids, false)`; both
// as wall time and as the process's CPU time (process.cpuUsage(), every thread). One
// call is in flight at a time, so the binding uses one thread of the libuv pool; the driver also
// sets UV_THREADPOOL_SIZE=1 and RAYON_NUM_THREADS=1. encodeBatch / decodeBatch are not used: the
// library runs a batch on its rayon pool (several threads), which is not a one-thread figure.
'use strict';

const fs = require('fs');
const path = require('path');

function nowS() {
  return Number(process.hrtime.bigint()) / 1e9;
}

// CPU seconds of the whole process (every thread, the libuv worker that runs the call included).
function cpuS() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

async function main(argv) {
  if (argv.length !== 5) {
    process.stderr.write(
        'usage: node tokenizer_reference_bench.js NODE_MODULES TOKENIZER_JSON DOCS.jsonl PASSES IDS_OUT\n');
    return 2;
  }
  const [modules, tokenizerPath, docsPath, passesArg, idsOut] = argv;
  const passes = parseInt(passesArg, 10);
  if (!(passes >= 1)) {
    process.stderr.write(`PASSES must be a positive integer, got ${passesArg}\n`);
    return 2;
  }
  const {Tokenizer} = require(path.join(path.resolve(modules), '@anush008', 'tokenizers'));
  const loadStart = nowS();
  const tok = Tokenizer.fromFile(tokenizerPath);
  const loadS = nowS() - loadStart;
  const lines = fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l.length > 0);
  const docs = lines.map((l) => JSON.parse(l).text);
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, 'utf8'), 0);
  const ids = new Array(docs.length);
  const decoded = new Array(docs.length);
  let encodeS = Infinity;
  let decodeS = Infinity;
  let encodeCpuS = Infinity;
  let decodeCpuS = Infinity;
  let tokens = 0;
  for (let pass = 0; pass <= passes; ++pass) {
    let spent = 0;
    let cpu = 0;
    tokens = 0;
    for (let i = 0; i < docs.length; ++i) {
      const c0 = cpuS();
      const t0 = nowS();
      const enc = await tok.encode(docs[i], null, {addSpecialTokens: false});
      spent += nowS() - t0;
      cpu += cpuS() - c0;
      ids[i] = enc.getIds();
      tokens += ids[i].length;
    }
    if (pass > 0) {
      encodeS = Math.min(encodeS, spent);
      encodeCpuS = Math.min(encodeCpuS, cpu);
    }
    spent = 0;
    cpu = 0;
    for (let i = 0; i < ids.length; ++i) {
      const c0 = cpuS();
      const t0 = nowS();
      decoded[i] = await tok.decode(ids[i], false);
      spent += nowS() - t0;
      cpu += cpuS() - c0;
    }
    if (pass > 0) {
      decodeS = Math.min(decodeS, spent);
      decodeCpuS = Math.min(decodeCpuS, cpu);
    }
  }
  const out = fs.openSync(idsOut, 'w');
  for (let i = 0; i < ids.length; ++i) {
    fs.writeSync(out, JSON.stringify({ids: ids[i], text: decoded[i]}) + '\n');
  }
  fs.closeSync(out);
  process.stdout.write(JSON.stringify({
    documents: docs.length, bytes, tokens, load_s: loadS, encode_s: encodeS, decode_s: decodeS,
    encode_cpu_s: encodeCpuS, decode_cpu_s: decodeCpuS, passes,
  }) + '\n');
  return 0;
}

main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; }, (e) => {
  process.stderr.write(`tokenizer_reference_bench.js: ${e && e.stack ? e.stack : e}\n`);
  process.exitCode = 1;
});
