package server

import (
	"encoding/json"
	"net/http"
)

// tokenizeRequest covers both of vLLM's shapes: {prompt} and {messages}.
type tokenizeRequest struct {
	Model               string            `json:"model"`
	Prompt              *string           `json:"prompt"`
	Messages            []chatMessageIn   `json:"messages"`
	AddSpecialTokens    *bool             `json:"add_special_tokens"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	ReturnTokenStrs     bool              `json:"return_token_strs"`
	Tools               []json.RawMessage `json:"tools"`
	ChatTemplateKwargs  map[string]any    `json:"chat_template_kwargs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func (s tokenizeAPI) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeAPIError(w, ae)
		return
	}
	if ae := s.checkModel(req.Model); ae != nil {
		writeAPIError(w, ae)
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeAPIError(w, badRequest("prompt", "give either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		add := true
		if req.AddSpecialTokens != nil {
			add = *req.AddSpecialTokens
		}
		ids = s.b.Tokenize(*req.Prompt, add)
	case req.Messages != nil:
		// As for chat completions: the template writes the special tokens.
		add := false
		if req.AddSpecialTokens != nil {
			add = *req.AddSpecialTokens
		}
		var ae *apiError
		if ids, ae = s.chatPrompt(req.Messages, req.AddGenerationPrompt, req.Tools, req.ChatTemplateKwargs, add); ae != nil {
			writeAPIError(w, ae)
			return
		}
	default:
		writeAPIError(w, badRequest("prompt", "prompt or messages is required"))
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.b.ContextLen(), Tokens: ids}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i] = s.b.TokenText(id)
		}
	}
	writeJSON(w, resp)
}

type detokenizeRequest struct {
	Model  string          `json:"model"`
	Tokens json.RawMessage `json:"tokens"`
}

func (s tokenizeAPI) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeAPIError(w, ae)
		return
	}
	if ae := s.checkModel(req.Model); ae != nil {
		writeAPIError(w, ae)
		return
	}
	var ids []int32
	if len(req.Tokens) == 0 || json.Unmarshal(req.Tokens, &ids) != nil || ids == nil {
		writeAPIError(w, badRequest("tokens", "tokens must be a list of token ids"))
		return
	}
	if ae := s.checkPromptIDs(ids, "tokens"); ae != nil {
		writeAPIError(w, ae)
		return
	}
	writeJSON(w, map[string]string{"prompt": s.b.Detokenize(ids)})
}
