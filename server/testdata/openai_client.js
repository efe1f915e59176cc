// Drives the official openai-node client against a Pagoda server.
// Usage: NODE_PATH=<dir>/node_modules node openai_client.js <baseURL> <apiKey>
const { OpenAI } = require("openai");
const { VERSION } = require("openai/version");

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 20000 });
  const out = { version: VERSION };

  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  const chat = await client.chat.completions.create({
    model: "fake-model",
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 3,
    logprobs: true,
    top_logprobs: 1,
  });
  out.chat = {
    id: chat.id, content: chat.choices[0].message.content, role: chat.choices[0].message.role,
    finish: chat.choices[0].finish_reason, usage: chat.usage,
    lp: chat.choices[0].logprobs.content.map((c) => [c.token, c.logprob]),
  };

  const stream = await client.chat.completions.create({
    model: "fake-model",
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 4, n: 2, stream: true, stream_options: { include_usage: true },
  });
  const texts = ["", ""];
  let finish = [null, null], usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] += c.delta.content || "";
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  out.chatStream = { texts, finish, usage, chunks };

  const cmpl = await client.completions.create({ model: "fake-model", prompt: ["ab", "cd"], max_tokens: 2, echo: true });
  out.completion = { texts: cmpl.choices.map((c) => c.text), usage: cmpl.usage, object: cmpl.object };

  const cstream = await client.completions.create({ model: "fake-model", prompt: [5, 6, 7], max_tokens: 3, stream: true });
  let ctext = "", cfinish = null;
  for await (const chunk of cstream) {
    for (const c of chunk.choices) {
      ctext += c.text;
      if (c.finish_reason) cfinish = c.finish_reason;
    }
  }
  out.completionStream = { text: ctext, finish: cfinish };

  try {
    await client.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "hi" }], temperature: 9 });
    out.badRequest = "no error";
  } catch (e) {
    out.badRequest = { status: e.status, param: e.param, type: e.type };
  }
  try {
    await new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 }).models.list();
    out.badKey = "no error";
  } catch (e) {
    out.badKey = { status: e.status, code: e.code };
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
