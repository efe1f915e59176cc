#!/usr/bin/env python3
"""Regenerates random_stmt.json: random nested statements (for/if/set/
namespace/macro/call/filter/with/block set, loop variables) rendered by Python
Jinja2 in the transformers setup; only cases that render are kept.
Usage: python3 gen_random_stmt.py SEED N"""
import json, os, random, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.dont_write_bytecode = True
from gen_cases import env, V
random.seed(int(sys.argv[1]))
VARS = ["i", "j", "n", "ns.a", "ns.b", "x", "loop.index", "loop.first", "loop.last", "loop.length", "loop.revindex", "loop.previtem", "loop.nextitem", "items", "name", "m(i)", "caller is defined"]
def ex():
    v = random.choice(VARS)
    return random.choice([v, v + " ~ '!'", v + " | string | length", "(" + v + ") is defined", v + " if " + random.choice(VARS) + " else 'no'"])
def st(d):
    k = random.randint(0, 10 if d < 3 else 2)
    if k == 0: return "{{ " + ex() + " }}"
    if k == 1: return random.choice(["a", " ", "\n", "b\n"])
    if k == 2: return "{% set x = " + ex() + " %}"
    if k == 3: return "{% set ns.a = " + ex() + " %}"
    if k == 4: return "{% for i in " + random.choice(["items", "range(3)", "[]", "'ab'", "items if t else []"]) + random.choice(["", " if i != 1"]) + " %}" + body(d+1) + random.choice(["", "{% else %}E"]) + "{% endfor %}"
    if k == 5: return "{% if " + ex() + " %}" + body(d+1) + random.choice(["", "{% elif " + ex() + " %}" + body(d+1)]) + random.choice(["", "{% else %}" + body(d+1)]) + "{% endif %}"
    if k == 6: return random.choice(["{% break %}", "{% continue %}"]) if "for" in str(d) else "{{ 'x' }}"
    if k == 7: return "{% filter upper %}" + body(d+1) + "{% endfilter %}"
    if k == 8: return "{% call(j) lst([1, 2]) %}" + body(d+1) + "{% endcall %}"
    if k == 9: return "{% with x = " + ex() + " %}" + body(d+1) + "{% endwith %}"
    return "{% set blk %}" + body(d+1) + "{% endset %}[{{ blk }}]"
def body(d): return "".join(st(d) for _ in range(random.randint(1, 3)))
PRE = "{% set ns = namespace(a=0, b='q') %}{% macro m(v) %}<{{ v }}>{% endmacro %}{% macro lst(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
cases = []
for _ in range(int(sys.argv[2])):
    tpl = PRE + body(0)
    # loop controls only inside for loops: Jinja rejects them elsewhere
    c = {"template": tpl}
    try: c["output"] = env.from_string(tpl).render(**V)
    except Exception as e: c["error"] = type(e).__name__ + ": " + str(e)
    if "error" not in c:  # errors here are mostly Jinja-strict undefined access
        cases.append(c)
json.dump({"vars": V, "cases": cases}, open("random_stmt.json", "w"), ensure_ascii=False)
print(len(cases), sum('error' in c for c in cases))
