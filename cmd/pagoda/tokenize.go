package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"pagoda/tokenizer"
)

func init() {
	register("tokenize", "print the token ids and pieces of a text (or decode ids with -decode)", runTokenize)
}

func runTokenize(args []string) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	path := fs.String("tokenizer", "", "tokenizer: a GGUF model or vocabulary, tokenizer.json (or its folder), llama2.c tokenizer.bin (required)")
	addSpecial := fs.Bool("add-special", true, "add BOS/EOS as the vocabulary says")
	parseSpecial := fs.Bool("parse-special", true, "recognise special tokens written in the text")
	decode := fs.Bool("decode", false, "the arguments are token ids: print their text")
	jsonOut := fs.Bool("json", false, "print the ids as a JSON array")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("-tokenizer is required")
	}
	tok, err := tokenizer.Load(*path)
	if err != nil {
		return err
	}
	text := strings.Join(fs.Args(), " ")
	if *decode {
		ids, err := parseIDs(text)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if id < 0 || int(id) >= tok.Vocab().Size() {
				return fmt.Errorf("token id %d outside the vocabulary of %d", id, tok.Vocab().Size())
			}
		}
		fmt.Println(tok.Decode(ids))
		return nil
	}
	ids := tok.Encode(text, tokenizer.Options{AddSpecial: *addSpecial, ParseSpecial: *parseSpecial})
	if *jsonOut {
		return json.NewEncoder(os.Stdout).Encode(ids)
	}
	v := tok.Vocab()
	for _, id := range ids {
		fmt.Printf("%8d  %q\n", id, v.Tokens[id])
	}
	fmt.Printf("%d tokens\n", len(ids))
	return nil
}
