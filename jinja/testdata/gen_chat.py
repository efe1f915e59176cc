#!/usr/bin/env python3
"""Regenerates chat_golden.json with Python Jinja2 set up as transformers'
apply_chat_template sets it up. Run from this folder: python3 gen_chat.py"""
import json, os, sys
sys.dont_write_bytecode = True
from gen_cases import env  # same environment as cases.json

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")

def shared_template(model):
    with open(os.path.join(SHARED, "models/tokenizers", model, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]

def local_template(name):
    with open(name) as f:
        return f.read()

BASIC = [
    {"Role": "system", "Content": "You are a helpful assistant."},
    {"Role": "user", "Content": "Hello!"},
    {"Role": "assistant", "Content": "Hi there. How can I help?"},
    {"Role": "user", "Content": "What is 2+2? "},
]
NO_SYSTEM = BASIC[1:]
THINK = [
    {"Role": "user", "Content": "Hi"},
    {"Role": "assistant", "Content": "<think>\nplanning\n</think>\n\nHello."},
    {"Role": "user", "Content": "Again"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CONV = [
    {"Role": "user", "Content": "Weather in Paris?"},
    {"Role": "assistant", "Content": "", "ToolCalls": [{"ID": "c1", "Type": "function",
        "Function": {"Name": "get_weather", "Arguments": "{\"city\": \"Paris\", \"units\": \"C\"}"}}]},
    {"Role": "tool", "Content": "{\"temp\": 21}", "ToolCallID": "c1"},
]

def to_hf(msgs):
    out = []
    for m in msgs:
        d = {"role": m["Role"], "content": m["Content"]}
        if m.get("Name"): d["name"] = m["Name"]
        if m.get("ToolCallID"): d["tool_call_id"] = m["ToolCallID"]
        if m.get("ToolCalls"):
            d["tool_calls"] = [{"id": c["ID"], "type": c["Type"], "function": {
                "name": c["Function"]["Name"], "arguments": json.loads(c["Function"]["Arguments"])}}
                for c in m["ToolCalls"]]
        out.append(d)
    return out

SPECIAL = {
    "llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
    "qwen3": ("", "<|im_end|>"),
    "deepseek-v3": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "gemma3": ("<bos>", "<eos>"),
}

CASES = []
for model in ["llama3", "qwen3", "deepseek-v3", "gemma3"]:
    bos, eos = SPECIAL[model]
    src = {"shared": f"models/tokenizers/{model}/tokenizer_config.json"}
    CASES.append(dict(name=model, source=src, messages=BASIC, gen=True, bos=bos, eos=eos))
    CASES.append(dict(name=model + "-nosys-nogen", source=src, messages=NO_SYSTEM, gen=False, bos=bos, eos=eos))
CASES.append(dict(name="qwen3-nothink", source={"shared": "models/tokenizers/qwen3/tokenizer_config.json"},
                  messages=BASIC, gen=True, extra={"enable_thinking": False}, eos="<|im_end|>"))
CASES.append(dict(name="qwen3-think-history", source={"shared": "models/tokenizers/qwen3/tokenizer_config.json"},
                  messages=THINK, gen=True, eos="<|im_end|>"))
CASES.append(dict(name="qwen3-tools", source={"shared": "models/tokenizers/qwen3/tokenizer_config.json"},
                  messages=[BASIC[0]] + TOOL_CONV, gen=True, tools=TOOLS, eos="<|im_end|>"))
CASES.append(dict(name="gemma3-alternation-error", source={"shared": "models/tokenizers/gemma3/tokenizer_config.json"},
                  messages=[BASIC[1], BASIC[1]], gen=True, bos="<bos>"))
for name in ["chatml", "llama2", "mistral-instruct-v0.1", "phi3", "zephyr"]:
    src = {"testdata": name + ".jinja"}
    CASES.append(dict(name=name, source=src, messages=BASIC, gen=True, bos="<s>", eos="</s>"))
    CASES.append(dict(name=name + "-nosys-nogen", source=src, messages=NO_SYSTEM, gen=False, bos="<s>", eos="</s>"))

for name, msgs, tools in [("llama3.2-tools", BASIC, None), ("llama3.2-tools", [BASIC[0]] + TOOL_CONV, TOOLS)]:
    CASES.append(dict(name=name + ("-with-tools" if tools else ""), source={"testdata": "llama3.2-tools.jinja"},
                      messages=msgs, gen=True, tools=tools, bos="<|begin_of_text|>", eos="<|eot_id|>"))

# strftime_now at a fixed instant; the Go test sets Template.Now to match.
from datetime import datetime
env.globals["strftime_now"] = lambda fmt: datetime(2024, 7, 6, 15, 4, 5).strftime(fmt)

out = []
for c in CASES:
    if "shared" in c["source"]:
        tpl = shared_template(c["source"]["shared"].split("/")[2])
    else:
        tpl = local_template(c["source"]["testdata"])
    kw = dict(messages=to_hf(c["messages"]), tools=c.get("tools"), add_generation_prompt=c["gen"],
              bos_token=c.get("bos", ""), eos_token=c.get("eos", ""))
    kw.update(c.get("extra", {}))
    rec = {"name": c["name"], "source": c["source"], "messages": c["messages"], "add_generation_prompt": c["gen"],
           "bos_token": c.get("bos", ""), "eos_token": c.get("eos", ""), "tools": c.get("tools"),
           "extra": c.get("extra")}
    try:
        rec["output"] = env.from_string(tpl).render(**kw)
    except Exception as e:
        rec["error"] = type(e).__name__ + ": " + str(e)
    out.append(rec)

with open("chat_golden.json", "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
for r in out:
    print(r["name"], "ERROR " + r["error"] if "error" in r else repr(r["output"][:100]))
