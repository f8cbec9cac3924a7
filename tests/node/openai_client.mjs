// The official `openai` npm client (pinned in package-lock.json) against
// `cacheprune serve`: a chat completion, a streamed one (the client parses
// the SSE framing), a legacy completion, the model list, an auth failure and
// a refused field.  Starts its own server on an ephemeral port.
//   node openai_client.mjs BIN MODEL_DIR
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, existsSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";

const [bin, model] = process.argv.slice(2);
if (!bin || !model) {
  console.error("usage: node openai_client.mjs BIN MODEL_DIR");
  process.exit(2);
}
if (!existsSync(join(model, "config.json"))) {
  console.log(`node client: no ${model} (the reference kit): skipped`);
  process.exit(0);
}

const KEY = "sk-node-0123456789abcdef";
const dir = mkdtempSync(join(tmpdir(), "cp-node-"));
writeFileSync(join(dir, "keys"), `${KEY} node-tenant\n`, { mode: 0o600 });

// sharing none: two requests of one prompt see exactly the same computation
const server = spawn(bin, ["serve", "--model", model, "--keys", join(dir, "keys"), "--port", "0", "--sharing", "none",
  "--served-model-name", "books"], { stdio: ["ignore", "pipe", "inherit"] });
const exited = new Promise((resolve) => server.on("exit", (code, signal) => resolve({ code, signal })));

const port = await new Promise((resolve, reject) => {
  let out = "";
  const timer = setTimeout(() => reject(new Error("the server did not say where it listens within 30 s")), 30000);
  server.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/listening on 127\.0\.0\.1:(\d+)/);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    }
  });
  server.on("exit", (code) => reject(new Error(`the server exited with ${code} before listening`)));
});

const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ apiKey: KEY, baseURL, maxRetries: 0, timeout: 30000 });
const messages = [
  { role: "system", content: "You tell stories." },
  { role: "user", content: "Once upon a time" },
];
let checks = 0;

try {
  const chat = await client.chat.completions.create({ model: "anything", messages, max_tokens: 16, temperature: 0 });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.model, "anything", "the model name is echoed");
  assert.equal(chat.choices.length, 1);
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(typeof chat.choices[0].message.content, "string");
  assert.ok(chat.choices[0].message.content.length > 0, "an empty answer proves nothing below");
  assert.ok(["stop", "length"].includes(chat.choices[0].finish_reason));
  assert.ok(chat.usage.prompt_tokens > 0);
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
  assert.equal(chat.usage.prompt_tokens_details.cached_tokens, 0);
  checks++;

  const stream = await client.chat.completions.create({ model: "anything", messages, max_tokens: 16, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(text, chat.choices[0].message.content, "the streamed chunks concatenate to the answer");
  assert.equal(finish, chat.choices[0].finish_reason);
  assert.deepEqual(usage, chat.usage, "usage in the last chunk");
  checks++;

  const cmpl = await client.completions.create({ model: "books", prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
  assert.equal(cmpl.object, "text_completion");
  assert.equal(typeof cmpl.choices[0].text, "string");
  checks++;

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["books"]);
  checks++;

  const stranger = new OpenAI({ apiKey: "sk-wrong-0123456789abcdef", baseURL, maxRetries: 0 });
  await assert.rejects(stranger.chat.completions.create({ model: "books", messages, max_tokens: 4 }), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, `not an AuthenticationError: ${e}`);
    assert.equal(e.status, 401);
    assert.equal(e.code, "invalid_api_key");
    return true;
  });
  checks++;

  await assert.rejects(client.chat.completions.create({ model: "books", messages, n: 2 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, `not a BadRequestError: ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.param, "n");
    return true;
  });
  checks++;
} finally {
  server.kill("SIGTERM");
}
const { code, signal } = await exited;
rmSync(dir, { recursive: true, force: true });
assert.equal(code, 0, `the server exited with ${code} (${signal}) after SIGTERM`);
const version = JSON.parse(readFileSync(new URL("./node_modules/openai/package.json", import.meta.url))).version;
console.log(`node client: ${checks} checks passed (openai ${version}, node ${process.version})`);
