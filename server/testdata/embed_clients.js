// Runs the official openai and ollama npm clients' embedding calls
// against a Pagoda server: node embed_clients.js BASE_URL MODEL
// Prints one JSON object with what each call returned.
const OpenAI = require('openai');
const { Ollama } = require('ollama');

async function main() {
  const [base, model] = process.argv.slice(2);
  const out = {};
  const oai = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0 });
  // The SDK asks for base64 by default and decodes it.
  const r = await oai.embeddings.create({ model, input: ['the cat sat on the mat.', 'she was happy'] });
  out.openai_default = { n: r.data.length, dim: r.data[0].embedding.length, vec: r.data[1].embedding, usage: r.usage };
  const f = await oai.embeddings.create({ model, input: 'she was happy', encoding_format: 'float', dimensions: 8 });
  out.openai_float_dims = { dim: f.data[0].embedding.length, vec: f.data[0].embedding };
  try {
    await oai.embeddings.create({ model, input: '' });
    out.openai_empty = 'accepted';
  } catch (e) {
    out.openai_empty = { status: e.status, message: e.message };
  }
  const ol = new Ollama({ host: base });
  const e = await ol.embed({ model, input: ['the cat sat on the mat.', 'she was happy'] });
  out.ollama_embed = { n: e.embeddings.length, dim: e.embeddings[0].length, vec: e.embeddings[1], count: e.prompt_eval_count };
  const legacy = await ol.embeddings({ model, prompt: 'she was happy' });
  out.ollama_embeddings = { dim: legacy.embedding.length, vec: legacy.embedding };
  try {
    await ol.embed({ model, input: 'cat '.repeat(300), truncate: false });
    out.ollama_too_long = 'accepted';
  } catch (err) {
    out.ollama_too_long = { status: err.status_code, message: err.error || err.message };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
