package main

import (
	"fmt"
	"os"

	"pagoda/embedded"
	"pagoda/hub"
)

// resolveModel turns a -m value into a file or directory the loaders open.
// No value means the model built into the binary, and the user is told
// which model that is and how to pick another, so its small stories are
// not mistaken for what Pagoda can do. A hub reference or URL is pulled on
// first use and taken from the cache afterwards, without the network; a
// local path that happens to look like a reference stays a local path.
func resolveModel(ref string) (string, error) {
	if ref != "" {
		if _, err := os.Stat(ref); err == nil || !hub.IsRef(ref) {
			return ref, nil
		}
		r, cache, err := cachedRef(ref)
		if err != nil {
			return "", err
		}
		if p, ok := cache.Lookup(r); ok {
			return p, nil
		}
		return pull(r, cache, false)
	}
	path, err := embedded.Path("")
	if err != nil {
		return "", fmt.Errorf("no -m given and the built-in model could not be written out: %w", err)
	}
	fmt.Fprintf(os.Stderr, "pagoda: no -m given: using the built-in %s (a 260K-parameter model trained on children's stories); pass -m FILE.gguf for another\n", embedded.Name)
	return path, nil
}
