// The Batch API through the official OpenAI Node SDK (the `openai` npm package), end to end against
// a carpool-router (issue 16, "How it is checked"; driven by openai_sdk_e2e.py, which starts the
// cluster). Every call goes through the SDK as an application's would; the script asserts and
// exits 1 with the failed assertion, or prints one JSON summary line and exits 0.
//
// usage: node openai_batch.mjs NODE_MODULES BASE_URL MODEL MAX_FILE_BYTES
//   BASE_URL: the gateway (http://127.0.0.1:PORT); MODEL: the served model (chat, completions
//   and embeddings); MAX_FILE_BYTES: the router's --batch-max-file-bytes.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const [modules, baseURL, model, maxFileBytesArg] = process.argv.slice(2);
if (!maxFileBytesArg) {
  process.stderr.write('usage: node openai_batch.mjs NODE_MODULES BASE_URL MODEL MAX_FILE_BYTES\n');
  process.exit(2);
}
const maxFileBytes = Number(maxFileBytesArg);
const require = createRequire(import.meta.url);
const sdk = require(path.join(path.resolve(modules), 'openai'));
const OpenAI = sdk.OpenAI || sdk.default;
const { toFile } = sdk;
const version = require(path.join(path.resolve(modules), 'openai', 'package.json')).version;

// No retries: each answer checked is the router's first.
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'carpool-batch-e2e', maxRetries: 0,
                            timeout: 60000 });
const ENDPOINT = '/v1/chat/completions';
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function jsonl(objects) {
  return objects.map((o) => (typeof o === 'string' ? o : JSON.stringify(o)) + '\n').join('');
}

function line(customId, body, url = ENDPOINT) {
  return { custom_id: customId, method: 'POST', url, body };
}

async function upload(text, name) {
  return client.files.create({ file: await toFile(Buffer.from(text), name), purpose: 'batch' });
}

async function waitFinal(id, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) return b;
    assert.ok(Date.now() < deadline, `batch ${id} still ${b.status} after ${timeoutMs} ms`);
    await sleep(100);
  }
}

// The SDK's error for a call that must fail: its HTTP status and error class name.
async function failure(promise) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof sdk.APIError, `not an APIError: ${e}`);
    return e;
  }
  assert.fail('the call succeeded');
}

async function outputLines(fileId) {
  const content = await client.files.content(fileId);
  const text = await content.text();
  assert.ok(text.endsWith('\n'), 'an output file ends its last line');
  return text.split('\n').filter((l) => l).map((l) => JSON.parse(l));
}

// ---- a batch of chat completions, against the same requests sent directly
const PROMPTS = [
  'Where does the carpool leave from?', 'Name three colours.', 'What is 2 + 2?',
  'Say hello in French.', 'Count to five.', 'The road was long and', 'Pick a number.',
  'Describe the sea.', 'Why is the sky blue?', 'Write a haiku.', 'List two fruits.',
  'What day is it?', 'Spell carpool.', 'Translate: good morning', 'Finish: once upon a',
  'Name a planet.', 'What is rain?', 'One word for happy.', 'Gr\u00fc\u00dfe, \u4e16\u754c',
  'The last question.',
];
const requests = PROMPTS.map((p, i) => line(`req-${i}`, {
  model,
  messages: i % 2 ? [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: p }]
    : [{ role: 'user', content: p }],
  temperature: 0,
  max_tokens: 3 + (i % 4),
}));
const inputText = jsonl(requests);
const input = await upload(inputText, 'chat.jsonl');
assert.equal(input.object, 'file');
assert.equal(input.purpose, 'batch');
assert.equal(input.bytes, Buffer.byteLength(inputText));
assert.equal(input.filename, 'chat.jsonl');
assert.deepEqual(await client.files.retrieve(input.id), input);

const created = await client.batches.create({
  input_file_id: input.id, endpoint: ENDPOINT, completion_window: '24h',
  metadata: { job: 'e2e', owner: 'carpool' },
});
assert.equal(created.object, 'batch');
assert.equal(created.input_file_id, input.id);
assert.equal(created.endpoint, ENDPOINT);
assert.equal(created.completion_window, '24h');
assert.deepEqual(created.metadata, { job: 'e2e', owner: 'carpool' });
assert.ok(['validating', 'in_progress'].includes(created.status), created.status);

const done = await waitFinal(created.id, 120000);
assert.equal(done.status, 'completed', JSON.stringify(done));
assert.deepEqual(done.request_counts, { total: 20, completed: 20, failed: 0 });
assert.ok(done.output_file_id, 'a completed batch has an output file');
assert.ok(done.created_at <= done.in_progress_at && done.in_progress_at <= done.finalizing_at &&
          done.finalizing_at <= done.completed_at, JSON.stringify(done));
const outputFile = await client.files.retrieve(done.output_file_id);
assert.equal(outputFile.purpose, 'batch_output');

const output = await outputLines(done.output_file_id);
assert.equal(output.length, requests.length);
const byId = new Map();
for (const o of output) {
  assert.ok(!byId.has(o.custom_id), `custom_id ${o.custom_id} answered twice`);
  byId.set(o.custom_id, o);
}
assert.deepEqual([...byId.keys()].sort(), requests.map((r) => r.custom_id).sort());
// prompt_tokens_details.cached_tokens tells the prefix cache's state, which the batch's run
// changed (the direct requests find its prompts cached): the token counts are compared.
const counts = (u) => [u.prompt_tokens, u.completion_tokens, u.total_tokens];
const direct = await Promise.all(requests.map((r) => client.chat.completions.create(r.body)));
requests.forEach((r, i) => {
  const o = byId.get(r.custom_id);
  assert.equal(o.error, null, JSON.stringify(o));
  assert.equal(o.response.status_code, 200);
  assert.ok(o.id && o.response.request_id, JSON.stringify(o));
  const body = o.response.body;
  assert.equal(body.object, 'chat.completion');
  assert.equal(body.model, model);
  // Greedy: the same request sent directly gives the same message, finish reason and usage.
  assert.deepEqual(body.choices[0].message, direct[i].choices[0].message, r.custom_id);
  assert.equal(body.choices[0].finish_reason, direct[i].choices[0].finish_reason);
  assert.deepEqual(counts(body.usage), counts(direct[i].usage), r.custom_id);
  assert.equal(body.usage.completion_tokens, r.body.max_tokens);
});
// A completed batch cannot be cancelled: 409, the SDK's ConflictError.
const conflict = await failure(client.batches.cancel(done.id));
assert.equal(conflict.status, 409);
assert.ok(conflict instanceof sdk.ConflictError, conflict.constructor.name);

// ---- the other two batch endpoints, each against the SDK's direct call
async function runBatch(endpoint, lines, name) {
  const file = await upload(jsonl(lines), name);
  const b = await waitFinal((await client.batches.create({
    input_file_id: file.id, endpoint, completion_window: '24h' })).id, 60000);
  assert.equal(b.status, 'completed', JSON.stringify(b));
  const out = new Map((await outputLines(b.output_file_id)).map((o) => [o.custom_id, o]));
  assert.deepEqual([...out.keys()].sort(), lines.map((l) => l.custom_id).sort());
  return { id: b.id, bodies: lines.map((l) => {
    assert.equal(out.get(l.custom_id).response.status_code, 200);
    return out.get(l.custom_id).response.body;
  }) };
}
const textLines = ['The carpool', 'Once upon a time', '1, 2, 3,'].map((p, i) => line(
  `text-${i}`, { model, prompt: p, temperature: 0, max_tokens: 4 + i }, '/v1/completions'));
const texts = await runBatch('/v1/completions', textLines, 'text.jsonl');
for (const [i, l] of textLines.entries()) {
  const d = await client.completions.create(l.body);
  const body = texts.bodies[i];
  assert.equal(body.object, 'text_completion');
  assert.equal(body.choices[0].text, d.choices[0].text, l.custom_id);
  assert.deepEqual(counts(body.usage), counts(d.usage), l.custom_id);
}
const embedLines = ['hello', 'carpool', 'a longer sentence to embed'].map((t, i) => line(
  `embed-${i}`, { model, input: t }, '/v1/embeddings'));
const embeds = await runBatch('/v1/embeddings', embedLines, 'embed.jsonl');
for (const [i, l] of embedLines.entries()) {
  const d = await client.embeddings.create(l.body);
  const body = embeds.bodies[i];
  const got = body.data[0].embedding;
  const want = d.data[0].embedding;
  assert.equal(body.object, 'list');
  assert.equal(got.length, want.length);
  // The batch's floats are JSON text, the SDK's direct call decodes base64 float32: equal to
  // float32 precision.
  got.forEach((x, k) => assert.ok(Math.abs(x - want[k]) <= 1e-6 * Math.max(1, Math.abs(x)),
                                  `${l.custom_id}[${k}]: ${x} vs ${want[k]}`));
  assert.equal(body.usage.prompt_tokens, d.usage.prompt_tokens);
}

// ---- batches.list: newest first, pages of `limit` chained by `after`
const small = await upload(jsonl([line('a', { model, messages: [{ role: 'user', content: 'a' }],
                                              temperature: 0, max_tokens: 2 })]), 'small.jsonl');
const extra = [];
for (let i = 0; i < 3; i++) {
  extra.push(await client.batches.create({ input_file_id: small.id, endpoint: ENDPOINT,
                                           completion_window: '24h' }));
}
for (const b of extra) assert.equal((await waitFinal(b.id, 60000)).status, 'completed');
const newest = [extra[2].id, extra[1].id, extra[0].id, embeds.id, texts.id, done.id];
const first = await client.batches.list({ limit: 2 });
assert.deepEqual(first.data.map((b) => b.id), newest.slice(0, 2));
assert.equal(first.has_more, true);
const second = await client.batches.list({ limit: 2, after: newest[1] });
assert.deepEqual(second.data.map((b) => b.id), newest.slice(2, 4));
assert.equal(second.has_more, true);
const listed = [];
for await (const b of client.batches.list({ limit: 3 })) listed.push(b.id);  // SDK pagination
assert.deepEqual(listed, newest);

// ---- bad lines: the batch fails before anything runs, every bad line listed by number
const good = requests[0];
const bad = await upload(jsonl([
  good,                                                                    // 1
  '{"custom_id": "broken", "method": "POST",',                             // 2 not JSON
  line(good.custom_id, good.body),                                         // 3 duplicate
  line('wrong-url', good.body, '/v1/embeddings'),                          // 4 another url
  { method: 'POST', url: ENDPOINT, body: good.body },                      // 5 no custom_id
  line('refused', { model, messages: 'not a list of messages' }),          // 6 refused body
]), 'bad.jsonl');
const failed = await waitFinal((await client.batches.create({
  input_file_id: bad.id, endpoint: ENDPOINT, completion_window: '24h' })).id, 60000);
assert.equal(failed.status, 'failed');
assert.equal(failed.output_file_id, null);
assert.ok(failed.failed_at >= failed.created_at);
assert.deepEqual(failed.errors.data.map((e) => [e.line, e.code]),
                 [[2, 'invalid_json'], [3, 'duplicate_custom_id'], [4, 'invalid_url'],
                  [5, 'missing_custom_id'], [6, 'invalid_body']]);
for (const e of failed.errors.data) assert.ok(e.message, JSON.stringify(e));

// ---- unknown ids: 404, the SDK's NotFoundError. Each call starts only when the one before has
// been answered: started together, a rejection that comes before its promise is awaited is an
// unhandled rejection, which ends Node.
for (const call of [() => client.files.retrieve('file-unknown'),
                    () => client.files.content('file-unknown'),
                    () => client.batches.retrieve('batch_unknown'),
                    () => client.batches.create({ input_file_id: 'file-unknown',
                                                  endpoint: ENDPOINT, completion_window: '24h' })]) {
  const e = await failure(call());
  assert.equal(e.status, 404);
  assert.ok(e instanceof sdk.NotFoundError, e.constructor.name);
}

// ---- an upload above --batch-max-file-bytes: 413
const filler = 'x'.repeat(200);
const big = [];
for (let n = 0; big.length * 300 < 2 * maxFileBytes; n++) {
  big.push(line(`big-${n}`, { model, messages: [{ role: 'user', content: filler }] }));
}
const tooLarge = await failure(upload(jsonl(big), 'big.jsonl'));
assert.equal(tooLarge.status, 413, String(tooLarge));

// ---- files.delete: gone afterwards
const deleted = await client.files.delete(small.id);
assert.deepEqual([deleted.id, deleted.deleted], [small.id, true]);
assert.equal((await failure(client.files.retrieve(small.id))).status, 404);

process.stdout.write(JSON.stringify({ sdk_version: version, batch: done.id, lines: output.length,
                                      listed: listed.length }) + '\n');
