package grammar

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// Spec is a constraint as data: what a request's output must match, in a
// form that can cross a process boundary and be compiled on the engine's
// side (Cache.Get). The server builds it from response_format or a forced
// tool call.
type Spec struct {
	// Kind is "json_object" (any JSON object) or "json_schema" (a
	// document valid against Schema).
	Kind string `json:"kind"`
	// Schema is the JSON schema, compact, for json_schema.
	Schema string `json:"schema,omitempty"`
	// Prefix and Suffix are literal text around the JSON document (a
	// Hermes tool call's <tool_call> and </tool_call>).
	Prefix string `json:"prefix,omitempty"`
	Suffix string `json:"suffix,omitempty"`
}

// Spec kinds.
const (
	KindJSONObject = "json_object"
	KindJSONSchema = "json_schema"
)

// Key is the SHA-256 of the spec's fields, length-prefixed so that no two
// specs share a key: the name a compiled grammar is cached under. It is a
// function of the spec alone, so every process agrees on it.
func (s Spec) Key() [32]byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range []string{s.Kind, s.Schema, s.Prefix, s.Suffix} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// Compile builds the spec's grammar within lim, stopping when ctx is done.
func (s Spec) Compile(ctx context.Context, lim Limits) (*Grammar, error) {
	switch s.Kind {
	case KindJSONObject:
		if s.Schema != "" || s.Prefix != "" || s.Suffix != "" {
			return nil, errors.New("grammar: json_object takes no schema, prefix or suffix")
		}
		return JSONObject(), nil
	case KindJSONSchema:
		return Compile(ctx, []byte(s.Schema), s.Prefix, s.Suffix, lim)
	}
	return nil, fmt.Errorf("grammar: unknown constraint kind %q (json_object or json_schema)", s.Kind)
}

// MaxCached is how many compiled specs a Cache keeps.
const MaxCached = 16

// Cache keeps compiled specs bound to one vocabulary by Spec.Key, least
// recently used first out, so repeated requests with one schema share its
// grammar and its cache of masks (at most about 8 MB each). Refusals are
// kept too, so a hostile schema sent again costs a hash; refusals for time
// or a client that left are not, as they may not repeat. It is safe for
// concurrent use.
type Cache struct {
	vocab func() *Vocab

	mu       sync.Mutex
	m        map[[32]byte]*list.Element
	order    list.List // of *cacheEntry, most recent first
	compiled int
}

type cacheEntry struct {
	key [32]byte
	c   *Constraint
	err error
}

// NewCache makes a cache whose constraints index the vocabulary vocab
// returns; it is called at the first compilation, so a server that never
// constrains never indexes its vocabulary.
func NewCache(vocab func() *Vocab) *Cache {
	return &Cache{vocab: sync.OnceValue(vocab), m: map[[32]byte]*list.Element{}}
}

// Get returns s compiled (from the cache, or compiled now within lim).
func (c *Cache) Get(ctx context.Context, s Spec, lim Limits) (*Constraint, error) {
	key := s.Key()
	ce, ok := c.get(key)
	if !ok {
		g, err := s.Compile(ctx, lim)
		ce = &cacheEntry{key: key, err: err}
		if err == nil {
			ce.c = New(g, c.vocab())
		}
		var se *SchemaError
		if err == nil || errors.As(err, &se) && !se.Transient {
			c.put(ce)
		}
	}
	return ce.c, ce.err
}

// Len is the number of entries, refusals included.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Compiled counts the compilations kept (grammars and refusals).
func (c *Cache) Compiled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.compiled
}

func (c *Cache) get(key [32]byte) (*cacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*cacheEntry), true
}

func (c *Cache) put(ce *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.compiled++
	if e, ok := c.m[ce.key]; ok {
		e.Value = ce
		c.order.MoveToFront(e)
		return
	}
	c.m[ce.key] = c.order.PushFront(ce)
	for c.order.Len() > MaxCached {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.m, old.Value.(*cacheEntry).key)
	}
}
