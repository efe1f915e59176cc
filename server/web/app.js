// Pagoda's page: a streaming chat over the OpenAI API and a live view of
// the engine. Plain script, no build step, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const turns = []; // {role, content} of the finished turns
let apiKey = sessionStorage.getItem("pagoda.key") || "";
let busy = null; // AbortController of the request streaming now

// headers adds the API key the same way an API client does: the page gets
// no privilege the API does not give.
function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

// askKey shows the key form; focus moves there only when it appears, as
// the engine poll asks again every second.
function askKey(why) {
  $("status").textContent = why;
  if (!$("keyform").hidden) return;
  $("keyform").hidden = false;
  $("apikey").focus();
}

$("keyform").addEventListener("submit", (e) => {
  e.preventDefault();
  apiKey = $("apikey").value.trim();
  sessionStorage.setItem("pagoda.key", apiKey);
  $("keyform").hidden = true;
  $("status").textContent = "";
  loadModel();
});

async function loadModel() {
  const r = await fetch("v1/models", { headers: headers(false) });
  if (r.status === 401) return askKey("this server needs an API key");
  if (!r.ok) return;
  const j = await r.json();
  $("model").textContent = j.data && j.data[0] ? j.data[0].id : "";
}

// ---- chat ----

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = text;
  div.append(label, body);
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return body;
}

function note(body, text) {
  const n = document.createElement("span");
  n.className = "note";
  n.textContent = " " + text;
  body.after(n);
}

function settings() {
  const num = (id) => {
    const v = parseFloat($(id).value);
    return Number.isFinite(v) ? v : undefined;
  };
  return { temperature: num("temperature"), top_p: num("top_p"), max_tokens: num("max_tokens") };
}

// requestFor builds the body: in chat mode the server applies the model's
// chat template to the messages; text mode is for models without one
// (the conversation so far is sent as a plain prompt to continue).
function requestFor(mode) {
  const msgs = [];
  const sys = $("system").value.trim();
  if (sys) msgs.push({ role: "system", content: sys });
  msgs.push(...turns);
  const body = Object.assign({ stream: true, stream_options: { include_usage: true } }, settings());
  if (mode === "chat") return ["v1/chat/completions", Object.assign(body, { messages: msgs })];
  body.prompt = msgs.map((m) => m.content).join("\n");
  return ["v1/completions", body];
}

// noteTemplate says once, under the first reply, when the chat template is
// not the model's own: the server falls back to ChatML for a model without
// one (as llama-server does), and the built-in story model ships its own.
let templateNoted = false;
function noteTemplate(mode, resp, body) {
  const kind = resp.headers.get("X-Pagoda-Chat-Template");
  if (mode !== "chat" || templateNoted || !kind || kind === "model" || kind === "custom") return;
  templateNoted = true;
  note(body, kind === "chatml-fallback"
    ? "(this model has no chat template: the server uses ChatML, as llama-server does)"
    : "(the built-in story model was not trained to chat: its template frames the chat as a dialogue in a story)");
}

// readSSE calls onData with each parsed "data:" payload until [DONE].
async function readSSE(resp, onData) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function errorText(resp) {
  try {
    const j = await resp.json();
    return (j.error && j.error.message) || resp.statusText;
  } catch {
    return resp.status + " " + resp.statusText;
  }
}

// stream runs one request; it returns the text produced, or throws.
async function stream(mode, body, ctl) {
  const [path, req] = requestFor(mode);
  const resp = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(req), signal: ctl.signal });
  if (resp.status === 401) {
    askKey("API key needed");
    throw new Error(await errorText(resp));
  }
  if (!resp.ok) {
    const msg = await errorText(resp);
    throw new Error(msg);
  }
  noteTemplate(mode, resp, body);
  const t0 = performance.now();
  let text = "";
  let tokens = 0;
  await readSSE(resp, (j) => {
    const c = j.choices && j.choices[0];
    const piece = c ? (c.delta ? c.delta.content : c.text) : "";
    if (piece) {
      text += piece;
      body.textContent = text;
      body.parentElement.scrollIntoView({ block: "end" });
    }
    if (j.usage) tokens = j.usage.completion_tokens;
  });
  const s = (performance.now() - t0) / 1000;
  if (tokens) $("speed").textContent = tokens + " tokens, " + (tokens / Math.max(s, 1e-3)).toFixed(1) + " tok/s";
  return text;
}

async function send() {
  const text = $("prompt").value;
  if (busy || !text.trim()) return;
  $("prompt").value = "";
  addMessage("user", text);
  turns.push({ role: "user", content: text });
  const body = addMessage("assistant", "");
  busy = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const out = await stream($("mode").value, body, busy);
    turns.push({ role: "assistant", content: out });
  } catch (err) {
    if (err.name === "AbortError") {
      note(body, "(stopped)");
      turns.push({ role: "assistant", content: body.textContent });
    } else {
      body.parentElement.classList.add("error");
      body.textContent = String(err.message || err);
      turns.pop(); // the failed turn is not part of the conversation
    }
  } finally {
    busy = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", () => busy && busy.abort());
$("clear").addEventListener("click", () => {
  if (busy) busy.abort();
  turns.length = 0;
  $("messages").textContent = "";
});

// ---- engine view ----

const samples = []; // {t, gen, steps, batched}: one a poll, 5 minutes kept
const keepMS = 5 * 60 * 1000;

function fmt(n) {
  return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e4 ? (n / 1e3).toFixed(1) + "k" : String(n);
}

function showStats(v) {
  const prev = samples.length ? samples[samples.length - 1] : null;
  samples.push({ t: v.time_ms, gen: v.generation_tokens, steps: v.steps, batched: v.batched_tokens });
  while (samples.length > 2 && samples[0].t < v.time_ms - keepMS) samples.shift();
  $("s-running").textContent = v.running;
  $("s-waiting").textContent = v.waiting;
  $("s-batch").textContent = v.running_seqs;
  $("s-steps").textContent = fmt(v.steps);
  $("s-gen").textContent = fmt(v.generation_tokens);
  $("s-hit").textContent = v.prefix_queries ? (100 * v.prefix_hit_rate).toFixed(1) + "%" : "–";
  $("s-kv").textContent = (100 * v.kv.usage).toFixed(1) + "%";
  // Tokens per step over the last poll interval; the lifetime average
  // until there is a previous sample.
  const ds = prev ? v.steps - prev.steps : v.steps;
  const db = prev ? v.batched_tokens - prev.batched : v.batched_tokens;
  if (ds > 0) $("s-tps").textContent = (db / ds).toFixed(1);
  drawSpark();
  if (v.blocks) drawBlocks(v.blocks, v.kv);
}

function rates() {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].t - samples[i - 1].t) / 1000;
    out.push({ t: samples[i].t, r: dt > 0 ? (samples[i].gen - samples[i - 1].gen) / dt : 0 });
  }
  return out;
}

function drawSpark() {
  const cv = $("spark");
  const g = cv.getContext("2d");
  const w = cv.width, h = cv.height;
  g.clearRect(0, 0, w, h);
  const rs = rates();
  if (!rs.length) return;
  const now = samples[samples.length - 1].t;
  // The window grows with the run up to keepMS, so a short run fills the
  // canvas instead of a sliver at its right edge.
  const active = rs.find((x) => x.r > 0);
  const from = active ? active.t - 2000 : samples[0].t;
  const span = Math.min(keepMS, Math.max(10000, now - from));
  const max = Math.max(1, ...rs.map((x) => x.r));
  g.strokeStyle = getComputedStyle(document.body).getPropertyValue("--accent") || "#2f6fdf";
  g.lineWidth = 1.5;
  g.beginPath();
  rs.forEach((x, i) => {
    const px = w - ((now - x.t) / span) * w;
    const py = h - 4 - (x.r / max) * (h - 14);
    i ? g.lineTo(px, py) : g.moveTo(px, py);
  });
  g.stroke();
  g.fillStyle = "#888";
  g.font = "10px sans-serif";
  g.fillText("max " + max.toFixed(0) + " tok/s · " + (span >= 60000 ? (span / 60000).toFixed(1) + " min" : Math.round(span / 1000) + " s"), 4, 10);
  $("s-rate").textContent = rs[rs.length - 1].r.toFixed(1) + " tok/s now";
}

// ownerColour spreads sequence ids around the hue circle so neighbouring
// sequences differ.
function ownerColour(seq) {
  return "hsl(" + ((seq * 137.508) % 360).toFixed(0) + " 65% 50%)";
}

function drawBlocks(b, kv) {
  const cv = $("blocks");
  const n = b.state.length;
  const cols = Math.max(1, Math.ceil(Math.sqrt(n * (cv.width / cv.height))));
  const size = Math.max(1, Math.floor(cv.width / cols));
  cv.height = Math.max(20, Math.ceil(n / cols) * size);
  const g = cv.getContext("2d");
  const pad = size >= 6 ? 1 : 0;
  g.clearRect(0, 0, cv.width, cv.height);
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) {
    const s = b.state.charCodeAt(i) - 48;
    counts[s]++;
    const x = (i % cols) * size, y = Math.floor(i / cols) * size;
    g.fillStyle = s === 0 ? "#8884" : s === 1 ? "#c9a227" : ownerColour(b.owner[i]);
    g.fillRect(x + pad, y + pad, size - 2 * pad, size - 2 * pad);
    if (s === 3 && size >= 6) {
      g.strokeStyle = "#000a";
      g.strokeRect(x + pad + 0.5, y + pad + 0.5, size - 2 * pad - 1, size - 2 * pad - 1);
    }
  }
  $("s-blocks").textContent = n + " × " + kv.block_size + " tokens: " + (counts[2] + counts[3]) + " in use, " +
    counts[1] + " cached, " + counts[0] + " free";
}

async function poll() {
  try {
    const r = await fetch("api/engine?blocks=1", { headers: headers(false) });
    if (r.status === 401) {
      askKey("API key needed for the engine view");
    } else if (r.status === 404) {
      $("engine-off").hidden = false;
      $("engine-off").textContent = "This server has no engine view.";
      return; // nothing will change: stop polling
    } else if (r.ok) {
      showStats(await r.json());
      $("status").textContent = "";
    }
  } catch (err) {
    $("status").textContent = "server unreachable";
  }
  setTimeout(poll, 1000);
}

// URL parameters prefill the form (and ?autosend=1 sends), so a link can
// reproduce a conversation start and a headless browser can drive the page.
function fromURL() {
  for (const id of ["system", "temperature", "top_p", "max_tokens", "mode"]) {
    if (params.has(id)) $(id).value = params.get(id);
  }
  if (params.has("prompt")) $("prompt").value = params.get("prompt");
  if (params.get("autosend") === "1") send();
}

loadModel();
fromURL();
poll();
