package cluster

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"pagoda/kvcache"
	"pagoda/model"
)

// The first frame on every connection to a worker is a hello (a
// little-endian uint32 length, then JSON): the coordinator's, which makes
// the worker a rank of a group, or another rank's, which joins the mesh.
// After the coordinator's hello and the worker's reply, the connection
// carries executor steps (package executor's wire).

// hello is the first message on a connection.
type hello struct {
	// Kind: "coordinator" (a tensor-parallel rank), "seq" (a
	// sequence-parallel rank, seqpar.go), "stage" (a pipeline
	// stage) or "peer" (another rank's mesh connection, or the previous
	// stage's).
	Kind string `json:"kind"`
	// Session names one group's lifetime, so a rank never joins a mesh of
	// an earlier group by a late connection.
	Session string `json:"session"`
	Rank    int    `json:"rank"`
	Ranks   int    `json:"ranks,omitempty"`
	// Peers are the workers' addresses by rank (by stage; stage-major
	// under tensor × pipeline), for the mesh and the links to the next
	// stage.
	Peers   []string `json:"peers,omitempty"`
	Threads int      `json:"threads,omitempty"`
	Context int      `json:"context,omitempty"`
	Model   *shape   `json:"model,omitempty"`
	KV      *kvSpec  `json:"kv,omitempty"`
	// Logits: this rank returns the step's logits (one rank does; the
	// others' are the same numbers and are not sent).
	Logits bool `json:"logits,omitempty"`
	// Layers is a pipeline stage's range of layers [lo, hi).
	Layers *[2]int `json:"layers,omitempty"`
	// TPRank and TPRanks make a pipeline stage a tensor-parallel group
	// (tensor × pipeline): this worker is rank TPRank of the stage's
	// TPRanks (0 or 1: the stage is one worker). Peers then lists every
	// worker stage-major, stage s's rank r at s·TPRanks + r, and a peer
	// hello's Rank is that index.
	TPRank  int `json:"tp_rank,omitempty"`
	TPRanks int `json:"tp_ranks,omitempty"`
	// ExchangeMS is the workers' deadline for one exchange with another
	// worker, in milliseconds (0: two minutes; Timeouts.Exchange).
	ExchangeMS int64 `json:"exchange_timeout_ms,omitempty"`
	// Wire is the form of activations between workers (f32, f16, bf16;
	// "" is f32): the coordinator's choice, which a peer's hello repeats
	// so that ranks told different forms do not join.
	Wire string `json:"wire,omitempty"`
}

// reply is a worker's answer to the coordinator's hello.
type reply struct {
	Error string `json:"error,omitempty"`
	Model *shape `json:"model,omitempty"`
	// Wire is the activations' form the worker took from the hello: a
	// worker that did not (an older one) leaves it empty and is refused
	// when the coordinator asked for another than f32.
	Wire string `json:"wire,omitempty"`
}

// shape is what must agree between the coordinator's model and a worker's
// so that they are the same model: a worker started with another file is
// refused by name of what differs.
type shape struct {
	Arch   string `json:"arch"`
	Layers int    `json:"layers"`
	Embd   int    `json:"embd"`
	Vocab  int    `json:"vocab"`
	Heads  int    `json:"heads"`
}

func shapeOf(c *model.Config) *shape {
	return &shape{Arch: c.Arch, Layers: c.NLayer, Embd: c.NEmbd, Vocab: c.VocabSize, Heads: c.NHead}
}

func (s *shape) diff(o *shape) error {
	if s == nil || o == nil {
		return fmt.Errorf("no model shape to compare")
	}
	if *s != *o {
		return fmt.Errorf("the worker's model (%s, %d layers, width %d, vocabulary %d, %d heads on its rank) is not the coordinator's (%s, %d layers, width %d, vocabulary %d, %d heads)",
			o.Arch, o.Layers, o.Embd, o.Vocab, o.Heads, s.Arch, s.Layers, s.Embd, s.Vocab, s.Heads)
	}
	return nil
}

// kvSpec is the KV storage a worker builds: the manager's block geometry
// and formats. The heads and layers come from the worker's own shard, or,
// when the manager has layer groups (MLA's latent cache, per-layer
// formats), from the groups, whose layers a pipeline stage renumbers to
// its own.
type kvSpec struct {
	BlockSize int           `json:"block_size"`
	NumBlocks int           `json:"num_blocks"`
	DType     string        `json:"dtype"`
	KFormat   string        `json:"k_format,omitempty"`
	VFormat   string        `json:"v_format,omitempty"`
	Window    int           `json:"window,omitempty"`
	Groups    []kvGroupSpec `json:"groups,omitempty"`
	// Policy is the cache's default policy (kvcache.ParsePolicy's form);
	// the workers' storage runs the stateful ones (kvcache.Follower).
	Policy string `json:"policy,omitempty"`
}

// kvGroupSpec is one layer group of the manager's configuration.
type kvGroupSpec struct {
	Layers  []int  `json:"layers"`
	NKVHead int    `json:"kv_heads"`
	Dims    [2]int `json:"dims"` // K, V per head
	KFormat string `json:"k_format,omitempty"`
	VFormat string `json:"v_format,omitempty"`
}

// specOf is the part of the manager's configuration the workers need,
// the default policy included: the stateful ones (H2O, SnapKV, Quest)
// keep their state with the workers' storage, told by the plans' notes.
// Layer groups split by layers (pipeline stages), not by heads.
func specOf(c kvcache.Config, what string, groups bool) (*kvSpec, error) {
	if _, ok := c.Policy.(kvcache.QueryShifter); ok {
		return nil, fmt.Errorf("%s: the KV policy %s moves positions, which the workers' storage cannot re-rotate yet", what, c.Policy)
	}
	if len(c.Groups) > 0 && !groups {
		return nil, fmt.Errorf("%s: KV cache groups (latent or per-layer formats) are not supported across workers yet", what)
	}
	s := &kvSpec{BlockSize: c.BlockSize, NumBlocks: c.NumBlocks, DType: c.DType.String(), Window: c.Window}
	if c.Policy != nil {
		s.Policy = kvcache.PolicyName(c.Policy)
	}
	if c.KFormat != nil {
		s.KFormat = c.KFormat.String()
	}
	if c.VFormat != nil {
		s.VFormat = c.VFormat.String()
	}
	for gi, g := range c.Groups {
		if g.Policy != nil {
			return nil, fmt.Errorf("%s: KV group %d's policy %s is not supported across workers yet", what, gi, g.Policy)
		}
		gs := kvGroupSpec{Layers: g.Layers, NKVHead: g.NKVHead, Dims: [2]int{g.KDim, g.VDim}}
		if g.KFormat != nil {
			gs.KFormat = g.KFormat.String()
		}
		if g.VFormat != nil {
			gs.VFormat = g.VFormat.String()
		}
		s.Groups = append(s.Groups, gs)
	}
	return s, nil
}

// config is the worker's KV storage configuration for its shard c,
// holding the layers of st (a pipeline stage's, or all).
func (s *kvSpec) config(c *model.Config, st model.Stage) (kvcache.Config, error) {
	if s.NumBlocks <= 0 || s.NumBlocks > 1<<26 || s.BlockSize < 0 || s.BlockSize > 1<<16 {
		return kvcache.Config{}, fmt.Errorf("KV storage of %d blocks of %d tokens", s.NumBlocks, s.BlockSize)
	}
	dt, err := kvcache.ParseDType(s.DType)
	if err != nil {
		return kvcache.Config{}, err
	}
	nkv, hd, _ := c.KVShape()
	kc := kvcache.Config{NLayer: st.Hi - st.Lo, NKVHead: nkv, HeadDim: hd, BlockSize: s.BlockSize, NumBlocks: s.NumBlocks, DType: dt, Window: s.Window, FirstLayer: st.Lo}
	if s.Policy != "" {
		if kc.Policy, err = kvcache.ParsePolicy(s.Policy); err != nil {
			return kvcache.Config{}, err
		}
	}
	if kc.KFormat, err = parseFormat(s.KFormat); err != nil {
		return kvcache.Config{}, err
	}
	if kc.VFormat, err = parseFormat(s.VFormat); err != nil {
		return kvcache.Config{}, err
	}
	for gi, g := range s.Groups {
		gs := kvcache.GroupSpec{NKVHead: g.NKVHead, KDim: g.Dims[0], VDim: g.Dims[1]}
		for _, l := range g.Layers {
			if l >= st.Lo && l < st.Hi {
				gs.Layers = append(gs.Layers, l-st.Lo)
			}
		}
		if len(gs.Layers) == 0 {
			return kvcache.Config{}, fmt.Errorf("KV group %d has no layer in %v (a stage must hold a layer of every group)", gi, st)
		}
		if gs.KFormat, err = parseFormat(g.KFormat); err != nil {
			return kvcache.Config{}, err
		}
		if gs.VFormat, err = parseFormat(g.VFormat); err != nil {
			return kvcache.Config{}, err
		}
		kc.Groups = append(kc.Groups, gs)
	}
	return kc, nil
}

// bytes is the KV storage config allocates for the shard c (Options.Reserve).
func (s *kvSpec) bytes(c *model.Config, st model.Stage) (int64, error) {
	kc, err := s.config(c, st)
	if err != nil {
		return 0, fmt.Errorf("KV storage: %w", err)
	}
	return int64(kc.NumBlocks) * kc.BlockBytes(), nil
}

// parseFormat is kvcache.ParseFormat, with "" for none.
func parseFormat(s string) (kvcache.Format, error) {
	if s == "" {
		return nil, nil
	}
	return kvcache.ParseFormat(s)
}

// maxHello bounds a hello frame.
const maxHello = 1 << 20

func writeMsg(w *bufio.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	return w.Flush()
}

func readMsg(r io.Reader, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxHello {
		return fmt.Errorf("hello of %d bytes (at most %d): not a pagoda peer", size, maxHello)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	return nil
}
