#!/usr/bin/env python3
"""Regenerates cases.json: expected outputs from Python Jinja2 (3.1.x) set up
exactly as Hugging Face transformers sets it up for chat templates
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
tojson with ensure_ascii=False, raise_exception). Run from this folder:
    python3 gen_cases.py
"""
import json
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.exceptions import TemplateError

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(message):
    raise TemplateError(message)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

V = {"name": "World", "n": 3, "f": 2.5, "items": [3, 1, 2], "words": ["b", "A", "c", "a"],
     "d": {"z": 1, "a": 2, "m": "x"}, "empty": [], "s": "  Hello World  ", "none": None,
     "t": True, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                         {"role": "user", "content": "bye"}],
     "users": [{"name": "ann", "age": 30, "admin": True}, {"name": "bob", "age": 25, "admin": False},
               {"name": "cy", "age": 35}],
     "uni": "héllo ✓ 😀", "nested": {"a": {"b": [1, {"c": "deep"}]}}}

CASES = [
    # output, literals, whitespace
    "Hello {{ name }}!",
    "{{ 'a' }}{{ \"b\" }}{{ 'it\\'s' }}{{ \"tab\\there\" }}{{ '\\u00e9' }}",
    "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 10/4 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }}",
    "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 3.0 }} {{ -0.0 }} {{ 100.0 / 3 }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ {} }}",
    "{{ none }} {{ None }} {{ true }} {{ True }} {{ false }} {{ False }} [{{ undefined_var }}]",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }}",
    "  {% if true %}\n  yes\n  {% endif %}\n  after\n",
    "{% for i in items %}\n  {{ i }}\n{% endfor %}\n",
    "{%- for i in items -%}\n  {{ i }}\n{%- endfor -%}\n",
    "a  {%- if true %} b {% endif -%}  c",
    "a\n{# comment #}\nb\n  {# indented comment #}\nc",
    "{% raw %}{{ not evaluated }}{% endraw %}",
    "x {{- ' y ' -}} z",
    "line1\n{%+ if true %}kept{% endif %}\n",
    "{% if true +%}\nnot trimmed{% endif %}",
    "{{ 'a' }}\n{{ 'b' }}\n",
    # conditionals
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if none else 'no' }} [{{ 'only' if false }}]",
    "{{ n > 1 and n < 5 }} {{ n > 5 or n == 3 }} {{ not t }} {{ 1 < n < 5 }} {{ 5 < n < 10 }}",
    "{{ none or 'default' }} {{ 0 and 'x' }} {{ 'a' and 'b' }} {{ [] or [1] }}",
    "{{ 2 in items }} {{ 9 not in items }} {{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 'q' in d }}",
    "{{ name is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none is none }} {{ n is not none }}",
    "{{ name is string }} {{ n is number }} {{ f is number }} {{ n is integer }} {{ f is float }} {{ d is mapping }} {{ items is iterable }} {{ name is iterable }} {{ items is sequence }} {{ t is boolean }} {{ t is true }} {{ t is false }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is equalto 3 }} {{ n is eq 3 }} {{ n is ne 3 }} {{ n is lt 5 }} {{ n is gt 5 }} {{ 2 is in items }} {{ 'abc' is lower }} {{ 'ABC' is upper }}",
    "{{ none is sameas none }} {{ n is sameas 3 }} {{ msgs[0].role == 'user' }} {{ msgs[0]['role'] != 'system' }}",
    # loops
    "{% for i in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }};{% endfor %}",
    "{% for i in items %}[{{ loop.previtem }}|{{ i }}|{{ loop.nextitem }}]{% endfor %}",
    "{% for i in items if i > 1 %}{{ i }}{{ loop.length }}{% else %}none{% endfor %}",
    "{% for i in empty %}x{% else %}empty!{% endfor %}",
    "{% for i in nope %}x{% else %}undef-empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %} {% for c in 'abc' %}{{ c }}-{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}:{{ loop.index }} {% endfor %}",
    "{{ range(5) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }}",
    "{% for m in msgs %}{{ loop.cycle('odd', 'even') }}{% endfor %}",
    "{% for r in msgs | map(attribute='role') %}{% if loop.changed(r) %}[{{ r }}]{% endif %}{% endfor %}{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
    "{% set count = 0 %}{% for i in range(3) %}{% set count = count + 1 %}{{ count }}{% endfor %}{{ count }}",
    # set / namespace
    "{% set x = 5 %}{% set y = x * 2 %}{{ x }} {{ y }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}",
    "{% set ns = namespace(total=0, found=false) %}{% for i in items %}{% set ns.total = ns.total + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}",
    "{% set block %}inner {{ name }}{% endset %}[{{ block }}]",
    "{% set up | upper %}shout {{ name }}{% endset %}{{ up }}",
    "{% set ns = namespace(items=[]) %}{% for i in items %}{% set ns.items = ns.items + [i * 2] %}{% endfor %}{{ ns.items }}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]",
    "{% set blk %}{% set x = 1 %}{% endset %}[{{ x }}]{% filter upper %}{% set y = 1 %}{% endfilter %}[{{ y }}]{% if true %}{% set z = 1 %}{% endif %}[{{ z }}]",
    # macros / call / filter block
    "{% macro greet(who, greeting='Hello') %}{{ greeting }}, {{ who }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet(who='Cy', greeting='Yo') }}",
    "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ name }}{% endcall %}",
    "{% macro lst(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(x) lst([1,2]) %}<{{ x }}>{% endcall %}",
    "{% filter upper %}hello {{ name }}{% endfilter %}",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
    # attribute / subscript / slice
    "{{ nested.a.b[1].c }} {{ nested['a']['b'][0] }} {{ nested.a.b.0 }} {{ items[-1] }} {{ items[5] }}|",
    "{{ items[1:] }} {{ items[:2] }} {{ items[::-1] }} {{ items[::2] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ items[-2:] }} {{ items[5:] }}",
    "{{ msgs[1:] | length }} {{ msgs[::-1][0].content }}",
    "{{ d.get('a') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }} {{ d.keys() | list }} {{ d.values() | list }}",
    # string methods
    "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '\\n\\nhi\\n'.lstrip('\\n') }}]",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} {{ 'a-b-c'.rsplit('-', 1) }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.startswith(('x', 'H')) }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }}",
    "{{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format('x', 'y') }} {{ '{name}!'.format(name='N') }} {{ 'ab12'.isalnum() }} {{ '12'.isdigit() }}",
    "{{ '<think>a</think>\\n\\nb'.split('</think>')[-1].lstrip('\\n') }}|{{ '<think>\\nr\\n</think>'.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
    # filters
    "{{ s | trim }}|{{ name | length }}|{{ items | length }}|{{ d | length }}|{{ name | upper }}|{{ name | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
    "{{ nope | default('dflt') }} {{ none | default('dflt') }} {{ '' | default('dflt', true) }} {{ nope | d('x') }} {{ name | default('dflt') }}",
    "{{ items | join(',') }} {{ users | join(', ', attribute='name') }} {{ items | first }} {{ items | last }} {{ items | list }} {{ 'ab' | list }}",
    "{{ d | tojson }} {{ uni | tojson }} {{ [1, 2.5, none, true, 'q\"'] | tojson }} {{ {'a': [1, {'b': 2}]} | tojson(indent=2) }}",
    "{{ d | tojson(sort_keys=true) }} {{ {} | tojson }} {{ [] | tojson(indent=2) }} {{ 'tab\\t\\u0001' | tojson }}",
    "{{ n | string }}{{ 3.0 | string }} {{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 4.9 | int }} {{ '2.5' | float }} {{ 3 | float }}",
    "{{ 'a-b' | replace('-', '+') }} {{ d | items | list }}",
    "{{ users | selectattr('admin') | map(attribute='name') | list }} {{ users | rejectattr('admin') | map(attribute='name') | list }}",
    "{{ users | selectattr('age', 'gt', 28) | map(attribute='name') | join('/') }} {{ users | selectattr('name', 'equalto', 'bob') | list | length }}",
    "{{ items | select('odd') | list }} {{ items | reject('odd') | list }} {{ [0, 1, '', 'a', none] | select | list }}",
    "{{ users | map(attribute='admin', default='?') | list }} {{ ['a', 'b'] | map('upper') | list }}",
    "{{ words | unique | list }} {{ [1, 2, 1, 3] | unique | list }} {{ words | sort | list }} {{ words | sort(case_sensitive=true) | list }} {{ items | sort(reverse=true) }}",
    "{{ users | sort(attribute='age') | map(attribute='name') | list }} {{ items | sum }} {{ users | sum(attribute='age') }} {{ items | min }} {{ items | max }} {{ words | max }}",
    "{{ 'a<b>&\"c\\'' | escape }} {{ 'x' | safe }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.4 | round(0, 'ceil') }} {{ 2.6 | round(0, 'floor') }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'one two  three' | wordcount }}",
    "{{ d | dictsort }} {{ d | dictsort(by='value', reverse=true) if false else d | dictsort(reverse=true) }}",
    "{{ items | batch(2) | list }} {{ items | batch(2, 0) | list }} {{ items | reverse | list }} {{ 'abc' | reverse }} {{ items | count }}",
    "{{ users | groupby('age') | map(attribute=0) | list }}",
    "{{ '%s-%d' | format('a', 3) }} {{ '%s!' % name }} {{ '%s/%s' % (1, 2) }}",
    "{{ msgs | map(attribute='role') | list | tojson }} {{ msgs | selectattr('role', 'equalto', 'user') | list | length }}",
    # dict / list literals & functions
    "{{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ {'k': 1}.items() | list }} {{ namespace(a=1).a }}",
    "{% set l = [1, 2] %}{{ l + [3] }} {{ l | length }} {{ (l + [3])[2] }}",
    # errors
    "{{ raise_exception('custom failure') }}",
    "{{ 1 + 'a' }}",
    "{{ undefined_fn() }}",
    "{{ 1 / 0 }}",
    "{{ items | no_such_filter }}",
    "{% for %}",
    "{% if true %}unclosed",
    "{{ 'unterminated }}",
    "{% endfor %}",
    "{{ 1 + }}",
]

def main():
  out = []
  for tpl in CASES:
      case = {"template": tpl}
      try:
          case["output"] = env.from_string(tpl).render(**V)
      except Exception as e:
          case["error"] = type(e).__name__ + ": " + str(e)
      out.append(case)

  with open("cases.json", "w") as f:
      json.dump({"vars": V, "cases": out}, f, ensure_ascii=False, indent=1)
      f.write("\n")
  print(len(out), "cases;", sum("error" in c for c in out), "errors")
  for c in out:
      if "error" in c:
          print("ERR", repr(c["template"][:50]), c["error"][:80])

if __name__ == "__main__":
    main()
