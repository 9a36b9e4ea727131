#!/usr/bin/env node
// The official OpenAI Node SDK (the `openai` npm package) as a line server for the end-to-end
// chat test (e2e_openai.py): one JSON request per stdin line, one JSON answer per stdout line, in
// order. Requests go through the SDK exactly as an application's would (client.models.list,
// client.chat.completions.create, streamed or not); carpool's extensions (chat_template_kwargs,
// add_generation_prompt, ignore_eos) ride in the body as extra fields, as the SDK passes them.
//
// usage: node e2e_openai.js NODE_MODULES
//   {"models": BASE_URL}                          -> {"ids": [MODEL IDS]}
//   {"create": BODY, "base_url": BASE_URL}        -> {"ok": true, "ms": N, "response": RESPONSE}
//                                                    (BODY.stream true: "chunks": [CHUNKS])
//                                                 or {"ok": false, "ms": N, "status": HTTP STATUS,
//                                                     "message": TEXT, "error": ERROR BODY}
//   {"parallel": [{"create": ..., "base_url": ..., "delay_ms": N}, ...]}
//                                                 -> {"results": [ANSWER, ...]} (each started
//                                                    delay_ms after the first, its end_ms
//                                                    counted from the first's start)
// The first line written, once the SDK has loaded, is {"version": SDK VERSION}.
'use strict';

const path = require('path');
const readline = require('readline');

function now() {
  return Number(process.hrtime.bigint() / 1000000n);
}

function main(argv) {
  if (argv.length !== 1) {
    process.stderr.write('usage: node e2e_openai.js NODE_MODULES\n');
    return Promise.resolve(2);
  }
  const modules = path.resolve(argv[0]);
  const sdk = require(path.join(modules, 'openai'));
  const OpenAI = sdk.OpenAI || sdk.default || sdk;
  const version = require(path.join(modules, 'openai', 'package.json')).version;
  const clients = new Map();
  const client = (baseURL) => {
    if (!clients.has(baseURL)) {
      // No retries: every answer the test sees is the router's first.
      clients.set(baseURL, new OpenAI({apiKey: 'carpool-e2e', baseURL, maxRetries: 0,
                                       timeout: 60000}));
    }
    return clients.get(baseURL);
  };

  async function create(request) {
    const start = now();
    try {
      const c = client(request.base_url);
      if (request.create.stream) {
        const stream = await c.chat.completions.create(request.create);
        const chunks = [];
        for await (const chunk of stream) chunks.push(chunk);
        return {ok: true, ms: now() - start, chunks};
      }
      const response = await c.chat.completions.create(request.create);
      return {ok: true, ms: now() - start, response};
    } catch (e) {
      // APIError: status, error (the body's "error" object), message.
      return {ok: false, ms: now() - start, status: e.status === undefined ? null : e.status,
              message: String(e.message), error: e.error === undefined ? null : e.error};
    }
  }

  async function answer(request) {
    if (typeof request.models === 'string') {
      const ids = [];
      for await (const m of client(request.models).models.list()) ids.push(m.id);
      return {ids};
    }
    if (request.create !== undefined) return create(request);
    if (Array.isArray(request.parallel)) {
      const t0 = now();
      const results = await Promise.all(request.parallel.map(
          (r) => new Promise((resolve) => setTimeout(resolve, r.delay_ms || 0))
                     .then(() => create(r))
                     .then((out) => Object.assign(out, {end_ms: now() - t0}))));
      return {results};
    }
    return {error: 'a request needs "models", "create" or "parallel"'};
  }

  process.stdout.write(JSON.stringify({version}) + '\n');
  const lines = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
  return (async () => {
    for await (const line of lines) {
      let out;
      try {
        out = await answer(JSON.parse(line));
      } catch (e) {
        out = {error: String(e && e.stack ? e.stack : e)};
      }
      process.stdout.write(JSON.stringify(out) + '\n');
    }
    return 0;
  })();
}

main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; }, (e) => {
  process.stderr.write(`e2e_openai.js: ${e && e.stack ? e.stack : e}\n`);
  process.exitCode = 1;
});
