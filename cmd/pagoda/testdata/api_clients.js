// Drives the official openai, ollama and @anthropic-ai/sdk npm clients
// against a running `pagoda serve` of the built-in model: chat, streaming,
// tools, embeddings and errors. Greedy answers must agree across the three
// APIs (same template, same stops), streams must equal their non-streamed
// replies, and errors must come back as each SDK's typed error.
// Usage: NODE_PATH=<dir>/node_modules node api_clients.js BASE_URL MODEL
// Prints one JSON line per check: {"api","name","ok","detail"}.
const OpenAI = require('openai');
const { Ollama } = require('ollama');
const Anthropic = require('@anthropic-ai/sdk').default;

const [base, model] = process.argv.slice(2);
const question = [{ role: 'user', content: 'Where is the ball?' }];
const weather = { name: 'get_weather', description: 'weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

function check(api, name, ok, detail) {
  console.log(JSON.stringify({ api, name, ok: !!ok, detail: ok ? undefined : detail }));
}

// expectError runs f, which must throw; it returns the error (null if none).
async function expectError(f) {
  try {
    await f();
  } catch (e) {
    return e;
  }
  return null;
}

function same(a, b) {
  if (a.length !== b.length) return false;
  return a.every((x, i) => Math.abs(x - b[i]) <= 1e-6);
}

async function openai(ref) {
  const c = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  const api = 'openai';
  const models = await c.models.list();
  check(api, 'models.list', models.data.some((m) => m.id === model), models.data);

  const r = await c.chat.completions.create({ model, messages: question, max_tokens: 40, temperature: 0 });
  const text = r.choices[0].message.content;
  check(api, 'chat', typeof text === 'string' && text.length > 0 && ['stop', 'length'].includes(r.choices[0].finish_reason) && r.usage.prompt_tokens > 0, r);
  ref.chat = text;
  ref.finish = r.choices[0].finish_reason;

  const s = await c.chat.completions.create({ model, messages: question, max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let streamed = '', finish = null, usage = null;
  for await (const chunk of s) {
    for (const ch of chunk.choices) {
      streamed += ch.delta.content || '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(api, 'chat stream equals chat', streamed === text && finish === ref.finish && usage && usage.completion_tokens === r.usage.completion_tokens, { streamed, text, finish, usage });

  const comp = await c.completions.create({ model, prompt: 'Once upon a time', max_tokens: 20, temperature: 0 });
  check(api, 'completions', comp.choices[0].text.length > 0, comp);

  // The built-in template renders no tools: tools offered answer as text,
  // a forced call is refused with the parameter named.
  const t = await c.chat.completions.create({ model, messages: question, max_tokens: 40, temperature: 0, tools: [{ type: 'function', function: weather }] });
  check(api, 'tools offered, template without tools: text reply', t.choices[0].message.content === text && !t.choices[0].message.tool_calls, t.choices[0]);
  let e = await expectError(() => c.chat.completions.create({ model, messages: question, tools: [{ type: 'function', function: weather }], tool_choice: { type: 'function', function: { name: 'get_weather' } } }));
  check(api, 'forced tool call refused (400 tool_choice)', e instanceof OpenAI.BadRequestError && e.param === 'tool_choice', String(e));

  const one = await c.embeddings.create({ model, input: 'the ball is red', encoding_format: 'float' });
  const batch = await c.embeddings.create({ model, input: ['a cat sat', 'the ball is red'] }); // base64, decoded by the SDK
  ref.embedding = one.data[0].embedding;
  check(api, 'embeddings (float; base64 batch equals single)', one.data[0].embedding.length > 0 && batch.data.length === 2 && same(batch.data[1].embedding, one.data[0].embedding) && one.usage.prompt_tokens > 0, { one: one.data[0].embedding.slice(0, 4), batch: batch.data[1].embedding.slice(0, 4) });

  e = await expectError(() => c.chat.completions.create({ model: 'no-such-model', messages: question }));
  check(api, 'unknown model: 404 model_not_found', e instanceof OpenAI.NotFoundError && e.code === 'model_not_found', String(e));
  e = await expectError(() => c.chat.completions.create({ model, messages: question, temperature: 7 }));
  check(api, 'bad temperature: 400', e instanceof OpenAI.BadRequestError && e.param === 'temperature', String(e));
  e = await expectError(() => c.completions.create({ model, prompt: 'ball '.repeat(3000), max_tokens: 1 }));
  check(api, 'prompt past the context: 400 context_length_exceeded', e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded', String(e));
}

async function ollama(ref) {
  const c = new Ollama({ host: base });
  const api = 'ollama';
  const opts = { temperature: 0, num_predict: 40 };
  const tags = await c.list();
  check(api, 'list', tags.models.some((m) => m.name === model || m.name === model + ':latest'), tags);
  const ps = await c.ps();
  check(api, 'ps', ps.models.length === 1 && ps.models[0].name.startsWith(model) && ps.models[0].size > 0, ps);
  const show = await c.show({ model });
  check(api, 'show (family, quantization_level, template)', show.details.family === 'llama' && show.details.quantization_level !== '' && show.template.length > 0, show.details);

  const r = await c.chat({ model, messages: question, options: opts });
  check(api, 'chat equals the OpenAI chat', r.message.role === 'assistant' && r.message.content === ref.chat && r.done && r.eval_count > 0, { got: r.message.content, want: ref.chat });
  let streamed = '', last = null;
  for await (const part of await c.chat({ model, messages: question, options: opts, stream: true })) {
    streamed += part.message.content;
    last = part;
  }
  check(api, 'chat stream equals chat', streamed === r.message.content && last.done && last.done_reason === r.done_reason, { streamed, last });

  const g = await c.generate({ model, prompt: 'Once upon a time', options: { temperature: 0, num_predict: 20 } });
  let gs = '';
  for await (const part of await c.generate({ model, prompt: 'Once upon a time', options: { temperature: 0, num_predict: 20 }, stream: true })) gs += part.response;
  check(api, 'generate, stream equals non-stream', g.response.length > 0 && gs === g.response && g.context.length > 0, { g: g.response, gs });

  const t = await c.chat({ model, messages: question, options: opts, tools: [{ type: 'function', function: weather }] });
  check(api, 'tools offered, template without tools: text reply', t.message.content === ref.chat && !(t.message.tool_calls && t.message.tool_calls.length), t.message);

  const e1 = await c.embed({ model, input: 'the ball is red' });
  const e2 = await c.embed({ model, input: ['a cat sat', 'the ball is red'] });
  check(api, 'embed equals OpenAI embeddings, batch equals single', same(e1.embeddings[0], ref.embedding) && same(e2.embeddings[1], ref.embedding), { got: e1.embeddings[0].slice(0, 4), want: ref.embedding.slice(0, 4) });

  let e = await expectError(() => c.chat({ model: 'no-such-model', messages: question }));
  check(api, 'unknown model: 404 in ollama shape', e && e.status_code === 404 && /not found/.test(e.error), e && { status: e.status_code, error: e.error });
  e = await expectError(() => c.chat({ model, messages: question, options: { temperature: -1 } }));
  check(api, 'bad option: 400 in ollama shape', e && e.status_code === 400 && typeof e.error === 'string' && e.error.length > 0, e && { status: e.status_code, error: e.error });
}

async function anthropic(ref) {
  const c = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  const api = 'anthropic';
  const req = { model, max_tokens: 40, temperature: 0, messages: question };
  const r = await c.messages.create(req);
  const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const wantStop = ref.finish === 'length' ? 'max_tokens' : 'end_turn';
  check(api, 'messages equals the OpenAI chat', r.type === 'message' && r.role === 'assistant' && text === ref.chat && r.stop_reason === wantStop, { got: text, want: ref.chat, stop: r.stop_reason });

  const order = [];
  let streamed = '';
  for await (const ev of await c.messages.create({ ...req, stream: true })) {
    order.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') streamed += ev.delta.text;
  }
  const okOrder = order[0] === 'message_start' && order.at(-1) === 'message_stop' && order.at(-2) === 'message_delta' && order.includes('content_block_start') && order.includes('content_block_stop');
  check(api, 'stream: event order, text equals messages', okOrder && streamed === text, { order, streamed });
  const fin = await c.messages.stream(req).finalMessage();
  check(api, 'messages.stream().finalMessage()', fin.content[0].text === text && fin.stop_reason === r.stop_reason, fin);

  const multi = await c.messages.create({ model, max_tokens: 20, temperature: 0, system: 'Tom and Mom were at the park.',
    messages: [question[0], { role: 'assistant', content: 'It is in the tree.' }, { role: 'user', content: [{ type: 'text', text: 'Can you get it?' }] }] });
  check(api, 'system prompt and multi-turn', multi.content[0].type === 'text' && multi.usage.input_tokens > r.usage.input_tokens, multi);

  const sp = await c.messages.create({ ...req, stop_sequences: [' '] });
  check(api, 'stop_sequences', sp.stop_reason === 'stop_sequence' && sp.stop_sequence === ' ' && !sp.content[0].text.includes(' '), sp);

  const n = await c.messages.countTokens({ model, messages: question });
  check(api, 'count_tokens equals usage.input_tokens', n.input_tokens === r.usage.input_tokens, { count: n, usage: r.usage });

  const tools = [{ name: weather.name, description: weather.description, input_schema: weather.parameters }];
  const t = await c.messages.create({ ...req, tools });
  check(api, 'tools offered, template without tools: text reply', t.content.length === 1 && t.content[0].type === 'text' && t.content[0].text === text, t.content);
  let e = await expectError(() => c.messages.create({ ...req, tools, tool_choice: { type: 'tool', name: 'get_weather' } }));
  check(api, 'forced tool_use refused: 400 invalid_request_error', e instanceof Anthropic.BadRequestError && e.error.type === 'error' && e.error.error.type === 'invalid_request_error', String(e));

  e = await expectError(() => c.messages.create({ ...req, model: 'no-such-model' }));
  check(api, 'unknown model: 404 not_found_error', e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error', String(e));
  e = await expectError(() => c.messages.create({ model, messages: question }));
  check(api, 'missing max_tokens: 400', e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.error.error.message), String(e));
}

async function main() {
  const ref = {};
  for (const [name, f] of [['openai', openai], ['ollama', ollama], ['anthropic', anthropic]]) {
    try {
      await f(ref);
    } catch (e) {
      check(name, 'no unexpected exception', false, String(e && e.stack || e));
    }
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
