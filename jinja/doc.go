// Package jinja renders Jinja2 templates, chiefly Hugging Face chat
// templates (tokenizer_config.json "chat_template"), with the environment
// transformers uses: trim_blocks and lstrip_blocks on, loop controls,
// raise_exception and strftime_now globals, and a tojson that keeps
// non-ASCII text and key order like Python's json.dumps.
//
// Values follow Python semantics (str/repr formatting, truthiness, ==,
// ordering, integer vs float arithmetic). Two deliberate deviations from
// Jinja's defaults: attribute or item access on an undefined value yields
// another undefined value instead of an error, and lists and dicts may be
// mutated (append, update), which transformers' sandbox forbids.
//
// Rendering is bounded: Template.MaxOutput caps output and intermediate
// string sizes, Template.MaxSteps caps loop iterations, macro calls and
// list sizes, and nesting depth is limited, so hostile templates end in an
// error rather than exhausting memory or the stack.
package jinja
