package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"pagoda/engine"
	"pagoda/grammar"
)

// finishToolCalls is OpenAI's finish reason for a reply that is tool calls;
// the engine only knows it stopped.
const finishToolCalls engine.FinishReason = "tool_calls"

// ChatTemplateSourcer is optionally implemented by a Backend so the server
// can tell from the chat template which tool-call syntax the model was
// trained to write. Without it tool calls come back as plain content.
type ChatTemplateSourcer interface {
	ChatTemplateSource() string
}

// toolFormat is a family of tool-call syntaxes, named after the models
// whose chat templates teach them.
type toolFormat int

const (
	toolNone    toolFormat = iota
	toolHermes             // Qwen 2.5/3: <tool_call>{json}</tool_call>, repeated
	toolLlama              // Llama 3.x: the whole reply is one JSON object
	toolMistral            // [TOOL_CALLS][{…}] or [TOOL_CALLS]name[ARGS]{…}
)

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
	pythonTag   = "<|python_tag|>"
	mistralTag  = "[TOOL_CALLS]"
	mistralArgs = "[ARGS]"
)

// detectToolFormat looks for the markers a template writes for assistant
// tool calls; the order matters because a template may mention several
// (Mistral ones never contain <tool_call>, Qwen ones never [TOOL_CALLS]).
func detectToolFormat(tmpl string) toolFormat {
	switch {
	case strings.Contains(tmpl, hermesOpen):
		return toolHermes
	case strings.Contains(tmpl, mistralTag):
		return toolMistral
	case strings.Contains(tmpl, pythonTag),
		strings.Contains(tmpl, "<|start_header_id|>") && strings.Contains(tmpl, `"parameters"`):
		return toolLlama
	}
	return toolNone
}

// markerTokens are the ids of f's markers that the vocabulary holds as
// single (special) tokens: the output processor must render them as text
// (engine.WithShowTokens), which detokenization does not do for control
// tokens, or the parser would never see a call.
func (s *Server) markerTokens(f toolFormat) []int32 {
	var markers []string
	switch f {
	case toolHermes:
		markers = []string{hermesOpen, hermesClose}
	case toolMistral:
		markers = []string{mistralTag, mistralArgs}
	case toolLlama:
		markers = []string{pythonTag}
	}
	var ids []int32
	for _, m := range markers {
		if t := s.b.Tokenize(m, false); len(t) == 1 {
			ids = append(ids, t[0])
		}
	}
	return ids
}

// toolDef is the part of a request's tool the grammar needs.
type toolDef struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// validToolName is OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$.
// It also keeps a name from holding a call's markup (</tool_call>).
func validToolName(n string) bool {
	if len(n) == 0 || len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// checkTools refuses, whatever tool_choice says, tools that are not
// function definitions as OpenAI takes them: {"type":"function",
// "function":{"name":…,"parameters":{…}}} with a valid name and, if given,
// an object for parameters.
func checkTools(tools []json.RawMessage) ([]toolDef, *apiError) {
	defs := make([]toolDef, len(tools))
	seen := map[string]bool{}
	for i, raw := range tools {
		d := &defs[i]
		if err := json.Unmarshal(raw, d); err != nil {
			return nil, badRequest("tools", "tools[%d] must be {\"type\":\"function\",\"function\":{\"name\":…}}", i)
		}
		if d.Type != "function" {
			return nil, badRequest("tools", "tools[%d].type %q is not supported (only \"function\")", i, d.Type)
		}
		if !validToolName(d.Function.Name) {
			return nil, badRequest("tools", "tools[%d].function.name %q must match ^[a-zA-Z0-9_-]{1,64}$", i, d.Function.Name)
		}
		if seen[d.Function.Name] {
			return nil, badRequest("tools", "tools[%d]: function %q is defined twice", i, d.Function.Name)
		}
		seen[d.Function.Name] = true
		if p := bytes.TrimSpace(d.Function.Parameters); len(p) > 0 && string(p) != "null" && p[0] != '{' {
			return nil, badRequest("tools", "tools[%d].function.parameters must be a JSON schema object, got %s", i, clip(p))
		}
	}
	return defs, nil
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// argumentsSchema is a tool's parameters as the schema of its call's
// arguments, which must be a JSON object: no parameters is any object, a
// schema without a type gets type object, and one that cannot be an
// object is refused (a forced call must be a call, not a string or a
// number the client cannot decode as arguments).
func argumentsSchema(name string, params json.RawMessage) (string, *apiError) {
	p := bytes.TrimSpace(params)
	if len(p) == 0 || string(p) == "null" {
		return `{"type":"object"}`, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(p, &top); err != nil {
		return "", badRequest("tools", "tool %q: parameters must be a JSON schema object: %v", name, err)
	}
	t, ok := top["type"]
	if !ok {
		for _, k := range []string{"anyOf", "oneOf", "allOf", "$ref", "enum", "const", "not", "if"} {
			if _, ok := top[k]; ok {
				return "", badRequest("tools", "tool %q: parameters: a forced call needs \"type\":\"object\" at the top of the schema (it has %s and no type)", name, k)
			}
		}
		top["type"] = json.RawMessage(`"object"`)
		b, err := json.Marshal(top)
		if err != nil {
			return "", badRequest("tools", "tool %q: parameters: %v", name, err)
		}
		return string(b), nil
	}
	var one string
	var many []string
	if json.Unmarshal(t, &one) == nil {
		many = []string{one}
	} else if json.Unmarshal(t, &many) != nil {
		return "", badRequest("tools", "tool %q: parameters.type must be a string or a list of strings", name)
	}
	if len(many) != 1 || many[0] != "object" {
		return "", badRequest("tools", "tool %q: parameters has type %s: a call's arguments are a JSON object, so the type must be \"object\"", name, clip(t))
	}
	return string(p), nil
}

// forcedTools reads tool_choice: nil for "auto" (or absent), an empty
// list for "none", otherwise the tools one of which the reply must call
// ("required": any; {"type":"function","function":{"name":…}}: that one).
func forcedTools(choice json.RawMessage, tools []json.RawMessage) (forced []toolDef, none bool, ae *apiError) {
	tc := bytes.TrimSpace(choice)
	if len(tc) == 0 || string(tc) == "null" {
		return nil, false, nil
	}
	var name string
	var mode string
	if err := json.Unmarshal(tc, &mode); err != nil {
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(tc, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
			return nil, false, badRequest("tool_choice", `tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":…}}`)
		}
		mode, name = "named", named.Function.Name
	}
	switch mode {
	case "none":
		return nil, true, nil
	case "auto":
		return nil, false, nil
	case "required", "named":
	default:
		return nil, false, badRequest("tool_choice", "tool_choice %q is not supported (none, auto, required or a named function)", mode)
	}
	if len(tools) == 0 {
		return nil, false, badRequest("tool_choice", "tool_choice %s needs tools", tc)
	}
	defs, ae := checkTools(tools)
	if ae != nil {
		return nil, false, ae
	}
	for _, d := range defs {
		if name == "" || d.Function.Name == name {
			forced = append(forced, d)
		}
	}
	if len(forced) == 0 {
		return nil, false, badRequest("tool_choice", "tool_choice names %q, which is not among the tools", name)
	}
	return forced, false, nil
}

// toolConstraint makes the reply one call of one of tools, in the syntax
// of format f: Hermes <tool_call>{"name":…,"arguments":…}</tool_call> or
// Llama's bare {"name":…,"parameters":…}.
func (s *Server) toolConstraint(ctx context.Context, f toolFormat, tools []toolDef) (*grammar.Spec, *apiError) {
	var prefix, suffix, args string
	switch f {
	case toolHermes:
		prefix, suffix, args = hermesOpen, hermesClose, "arguments"
	case toolLlama:
		args = "parameters"
	default:
		return nil, badRequest("tool_choice", "forcing a tool call needs a chat template with Hermes (<tool_call>) or Llama 3 JSON tool calls")
	}
	var branches []string
	for _, t := range tools {
		name, _ := json.Marshal(t.Function.Name)
		params, ae := argumentsSchema(t.Function.Name, t.Function.Parameters)
		if ae != nil {
			return nil, ae
		}
		branches = append(branches, fmt.Sprintf(`{"type":"object","properties":{"name":{"const":%s},%q:%s},"required":["name",%q],"additionalProperties":false}`,
			name, args, params, args))
	}
	schema := branches[0]
	if len(branches) > 1 {
		schema = `{"anyOf":[` + strings.Join(branches, ",") + `]}`
	}
	spec := &grammar.Spec{Kind: grammar.KindJSONSchema, Schema: schema, Prefix: prefix, Suffix: suffix}
	if err := s.checkConstraint(ctx, spec); err != nil {
		if errors.Is(err, errNoGrammar) {
			return nil, badRequest("tool_choice", "forcing a tool call is not supported by this backend")
		}
		return nil, badRequest("tools", "tool parameters: %v", err)
	}
	return spec, nil
}

// toolCall is one parsed call; Arguments is JSON text, as OpenAI sends it.
type toolCall struct {
	Name      string
	Arguments string
}

type toolCallFunc struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type toolCallOut struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolCallFunc `json:"function"`
}

type toolCallDelta struct {
	Index    int          `json:"index"`
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolCallFunc `json:"function"`
}

func toolCallsOut(calls []toolCall) []toolCallOut {
	out := make([]toolCallOut, len(calls))
	for i, c := range calls {
		out[i] = toolCallOut{ID: newToolCallID(), Type: "function", Function: toolCallFunc{Name: c.Name, Arguments: c.Arguments}}
	}
	return out
}

// newToolCallID is shorter than a completion id because clients echo it
// back into the prompt with every tool result.
func newToolCallID() string { return newID("call_")[:29] }

// markerIndex is where the first tool call starts in text, or -1.
func markerIndex(f toolFormat, text string) int {
	switch f {
	case toolHermes:
		return strings.Index(text, hermesOpen)
	case toolMistral:
		return strings.Index(text, mistralTag)
	case toolLlama:
		if i := strings.Index(text, pythonTag); i >= 0 {
			return i
		}
		// A bare JSON call has no marker; only a reply that opens with "{"
		// can be one, and the whitespace before it is no content.
		if strings.HasPrefix(strings.TrimLeft(text, " \t\r\n"), "{") {
			return 0
		}
	}
	return -1
}

// holdFrom is how much of a streamed reply may already go out as content:
// everything before a marker, or before a tail that may grow into one.
func holdFrom(f toolFormat, text string) int {
	if i := markerIndex(f, text); i >= 0 {
		return i
	}
	var m string
	switch f {
	case toolHermes:
		m = hermesOpen
	case toolMistral:
		m = mistralTag
	case toolLlama:
		if strings.HasPrefix(pythonTag, strings.TrimLeft(text, " \t\r\n")) {
			return 0 // a call may still open the reply
		}
		m = pythonTag
	default:
		return len(text)
	}
	for k := min(len(m)-1, len(text)); k > 0; k-- {
		if strings.HasSuffix(text, m[:k]) {
			return len(text) - k
		}
	}
	return len(text)
}

// splitToolCalls parses a whole reply. It returns the text outside the
// calls and the calls; when there are none, or any fails to parse, the
// reply is all content so nothing the model wrote is lost.
func splitToolCalls(f toolFormat, text string) (string, []toolCall) {
	i := markerIndex(f, text)
	if i < 0 {
		return text, nil
	}
	rest, calls, ok := parseToolCalls(f, text[i:])
	if !ok || len(calls) == 0 {
		return text, nil
	}
	return strings.TrimSpace(text[:i] + rest), calls
}

// parseToolCalls parses text that starts at a tool-call marker. rest is
// what lies outside the calls.
func parseToolCalls(f toolFormat, text string) (rest string, calls []toolCall, ok bool) {
	switch f {
	case toolHermes:
		return parseHermes(text)
	case toolLlama:
		return parseLlama(text)
	case toolMistral:
		return parseMistral(text)
	}
	return text, nil, false
}

func parseHermes(text string) (string, []toolCall, bool) {
	var rest strings.Builder
	var calls []toolCall
	for {
		i := strings.Index(text, hermesOpen)
		if i < 0 {
			rest.WriteString(text)
			return rest.String(), calls, true
		}
		rest.WriteString(text[:i])
		body := text[i+len(hermesOpen):]
		// Generation may stop at EOS before the closing tag.
		j := strings.Index(body, hermesClose)
		if j < 0 {
			j = len(body)
			text = ""
		} else {
			text = body[j+len(hermesClose):]
		}
		c, ok := decodeCall(body[:j], "arguments")
		if !ok {
			return "", nil, false
		}
		calls = append(calls, c)
	}
}

func parseLlama(text string) (string, []toolCall, bool) {
	text = strings.TrimSpace(strings.TrimPrefix(text, pythonTag))
	// Llama 3.x sometimes separates several calls with ";".
	var calls []toolCall
	for _, part := range strings.Split(text, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		c, ok := decodeCall(part, "parameters", "arguments")
		if !ok {
			return "", nil, false
		}
		calls = append(calls, c)
	}
	return "", calls, len(calls) > 0
}

func parseMistral(text string) (string, []toolCall, bool) {
	var calls []toolCall
	for strings.HasPrefix(text, mistralTag) {
		text = strings.TrimLeft(text[len(mistralTag):], " \t\r\n")
		if strings.HasPrefix(text, "[") {
			// Older templates: a JSON list of {"name", "arguments"}.
			var list []json.RawMessage
			n, ok := decodeOne(text, &list)
			if !ok {
				return "", nil, false
			}
			for _, raw := range list {
				c, ok := decodeCall(string(raw), "arguments")
				if !ok {
					return "", nil, false
				}
				calls = append(calls, c)
			}
			text = strings.TrimLeft(text[n:], " \t\r\n")
			continue
		}
		// Newer templates (v11+): name[ARGS]{…}, repeated after each tag.
		name, args, found := strings.Cut(text, mistralArgs)
		if !found || strings.TrimSpace(name) == "" || strings.ContainsAny(name, "{}[]\n") {
			return "", nil, false
		}
		var obj map[string]any
		n, ok := decodeOne(args, &obj)
		if !ok {
			return "", nil, false
		}
		calls = append(calls, toolCall{Name: strings.TrimSpace(name), Arguments: compactJSON(args[:n])})
		text = strings.TrimLeft(args[n:], " \t\r\n")
	}
	return text, calls, len(calls) > 0
}

// decodeOne decodes the first JSON value of s and says how many bytes it
// took, so calls written back to back can be split.
func decodeOne(s string, v any) (int, bool) {
	d := json.NewDecoder(strings.NewReader(s))
	if err := d.Decode(v); err != nil {
		return 0, false
	}
	return int(d.InputOffset()), true
}

// decodeCall reads {"name": …, <argsKey>: {…}}; arguments given as a JSON
// string (some fine-tunes do that) are taken as they are.
func decodeCall(s string, argsKeys ...string) (toolCall, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &m); err != nil {
		return toolCall{}, false
	}
	var c toolCall
	if json.Unmarshal(m["name"], &c.Name) != nil || c.Name == "" {
		return toolCall{}, false
	}
	c.Arguments = "{}"
	for _, k := range argsKeys {
		raw := bytes.TrimSpace(m[k])
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var str string
		if json.Unmarshal(raw, &str) == nil {
			c.Arguments = str
		} else if raw[0] == '{' {
			c.Arguments = compactJSON(string(raw))
		} else {
			return toolCall{}, false
		}
		break
	}
	return c, true
}

func compactJSON(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}
