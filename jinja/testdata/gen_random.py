#!/usr/bin/env python3
"""Regenerates random_ws.json: random whitespace-control-heavy templates
(trim/lstrip, -/+ markers, comments, raw, nested if/for/set) rendered by
Python Jinja2 in the transformers setup. Usage: python3 gen_random.py SEED N"""
import json, os, random, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from gen_cases import env, V
random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
WS = ["", " ", "  ", "\n", " \n", "\n  ", "\t", "\n\n", "  \n  ", "x", " y ", "\nz\n"]
def ws(): return random.choice(WS)
def sign(): return random.choice(["", "", "-", "+"])
def vsign(): return random.choice(["", "", "-"])
EXPRS = ["name", "n", "items", "'lit'", "n + 1", "items | length", "d.a", "none", "nope", "t", "s | trim",
         "'a' ~ n", "items[0]", "msgs[-1].role", "n > 2", "[1, 2]", "{'k': n}", "n * 2.5", "('x' if t else 'y')",
         "items | join('-')", "d | tojson", "users | map(attribute='name') | list", "(loop_var if loop_var is defined else 0)"]
def expr(): return random.choice(EXPRS)
def var(): return "{{" + vsign() + " " + expr() + " " + vsign() + "}}"
def block(depth):
    k = random.randint(0, 6 if depth < 3 else 1)
    if k <= 1: return ws() + var() + ws()
    if k == 2:
        return "{%" + sign() + " if " + expr() + " " + sign() + "%}" + body(depth+1) + \
               ("{%" + sign() + " else " + sign() + "%}" + body(depth+1) if random.random() < .5 else "") + \
               "{%" + sign() + " endif " + sign() + "%}"
    if k == 3:
        return "{%" + sign() + " for loop_var in items " + sign() + "%}" + body(depth+1) + "{{ loop_var }}" + "{%" + sign() + " endfor " + sign() + "%}"
    if k == 4:
        return "{#" + sign() + " c " + sign() + "#}"
    if k == 5:
        return "{%" + sign() + " set q = " + expr() + " " + sign() + "%}" + ws() + "{{ q }}"
    return "{%" + random.choice(["", "-"]) + " raw " + random.choice(["", "-"]) + "%}" + ws() + "{{ raw }}" + ws() + "{%" + random.choice(["", "-"]) + " endraw " + sign() + "%}"
def body(depth):
    return "".join(ws() + block(depth) + ws() for _ in range(random.randint(1, 3)))
cases = []
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2000):
    tpl = body(0) + random.choice(["", "\n", "\n\n"])
    c = {"template": tpl}
    try:
        c["output"] = env.from_string(tpl).render(**V)
    except Exception as e:
        c["error"] = type(e).__name__ + ": " + str(e)
    cases.append(c)
json.dump({"vars": V, "cases": cases}, open("random_ws.json", "w"), ensure_ascii=False)
print(len(cases), sum('error' in c for c in cases))
