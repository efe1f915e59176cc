package main

import (
	"log"

	"pagoda/embedded"
	"pagoda/server"
	"pagoda/tokenizer"
)

// chatTemplate is the template `serve` and `run --chat` both chat with:
// --chat-template, else the model's, else for the built-in model the
// template shipped with it, else ChatML. A template that is not the
// model's own is announced once.
func chatTemplate(v *tokenizer.Vocab, override string, builtin bool) server.ChatTemplate {
	ct := server.ResolveChatTemplate(override, v)
	if builtin && ct.Kind == server.TemplateFallback {
		ct = server.ChatTemplate{Source: embedded.ChatTemplate, Kind: server.TemplateBuiltin, Stops: embedded.ChatStops()}
	}
	if note := ct.FallbackNote(); note != "" {
		log.Printf("pagoda: chat template: %s", note)
	}
	return ct
}
