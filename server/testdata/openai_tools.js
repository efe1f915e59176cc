// Tool-call round trip with the official openai-node client; the server's
// fake backend always replies with two Qwen-style calls.
// Usage: NODE_PATH=<dir>/node_modules node openai_tools.js <baseURL> <apiKey>
const { OpenAI } = require("openai");

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 20000 });
  const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
  const messages = [{ role: "user", content: "weather in Paris?" }];
  const out = {};

  const r = await client.chat.completions.create({ model: "fake-model", messages, tools });
  const msg = r.choices[0].message;
  out.finish = r.choices[0].finish_reason;
  out.content = msg.content;
  out.calls = msg.tool_calls.map((c) => [c.type, c.function.name, JSON.parse(c.function.arguments), c.id.startsWith("call_")]);

  const stream = await client.chat.completions.create({ model: "fake-model", messages, tools, stream: true });
  const calls = [];
  let content = "", sfinish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta.content || "";
      for (const d of c.delta.tool_calls || []) {
        if (!calls[d.index]) calls[d.index] = { name: "", args: "" };
        if (d.function?.name) calls[d.index].name += d.function.name;
        if (d.function?.arguments) calls[d.index].args += d.function.arguments;
      }
      if (c.finish_reason) sfinish = c.finish_reason;
    }
  }
  out.stream = { content, finish: sfinish, calls: calls.map((c) => [c.name, JSON.parse(c.args)]) };

  // Send the calls back with their results, as an agent loop does.
  messages.push(msg);
  for (const c of msg.tool_calls) messages.push({ role: "tool", tool_call_id: c.id, content: "sunny" });
  const r2 = await client.chat.completions.create({ model: "fake-model", messages, tools });
  out.roundTrip = r2.choices[0].finish_reason;
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
