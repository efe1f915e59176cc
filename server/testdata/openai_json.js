// JSON mode and structured outputs with the official openai-node client,
// against the real stories260K model.
// Usage: NODE_PATH=<dir>/node_modules node openai_json.js <baseURL> <apiKey>
const { OpenAI } = require("openai");

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
  const model = "stories260K";
  const messages = [{ role: "user", content: "Tell me about a girl and her pet." }];
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 10 },
      age: { type: "integer" },
      pet: { enum: ["cat", "dog"] },
      friends: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 2 },
    },
    required: ["name", "age", "pet", "friends"],
    additionalProperties: false,
  };
  const out = {};

  const o = await client.chat.completions.create({ model, messages, max_tokens: 100, seed: 3, response_format: { type: "json_object" } });
  out.object = { content: o.choices[0].message.content, finish: o.choices[0].finish_reason };

  // parse() JSON.parses a json_schema reply into message.parsed.
  const parse = client.chat.completions.parse ? client.chat.completions.parse.bind(client.chat.completions)
    : client.beta.chat.completions.parse.bind(client.beta.chat.completions);
  const response_format = { type: "json_schema", json_schema: { name: "pet_owner", strict: true, schema } };
  const p = await parse({ model, messages, max_tokens: 300, n: 2, seed: 4, response_format });
  out.schema = p.choices.map((c) => ({ parsed: c.message.parsed, finish: c.finish_reason }));

  const stream = await client.chat.completions.create({ model, messages, max_tokens: 300, seed: 5, stream: true, response_format });
  let text = "", finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.delta.content || "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  out.stream = { parsed: JSON.parse(text), finish };

  // A forced call: the story model knows no tools; the grammar writes one.
  // The grammar allows up to 21 bytes of white space at each of about 15
  // places, so 400 tokens always hold the whole call.
  const tools = [{ type: "function", function: { name: "get_time", parameters: { type: "object", properties: { tz: { enum: ["CET", "UTC"] } }, required: ["tz"] } } }];
  const t = await client.chat.completions.create({ model, messages, max_tokens: 400, seed: 6, tools, tool_choice: "required" });
  out.tool = { finish: t.choices[0].finish_reason, calls: (t.choices[0].message.tool_calls || []).map((c) => [c.function.name, JSON.parse(c.function.arguments)]) };

  try {
    await client.chat.completions.create({ model, messages, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "^a" } } } });
    out.bad = { status: 200 };
  } catch (e) {
    out.bad = { status: e.status, param: e.param, message: e.message };
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
