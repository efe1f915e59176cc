package kvcache

import "fmt"

// GroupSpec describes the KV of a set of layers that share a shape, a
// storage format and a policy (vLLM's KV cache spec per layer group):
// full-attention and sliding-window layers of one model, or MLA's latent.
type GroupSpec struct {
	Layers  []int // layer indices
	NKVHead int
	// KDim and VDim are per KV head. VDim 0 means there are no separate
	// values: the K row serves as both (MLA's single latent).
	KDim, VDim       int
	KFormat, VFormat Format // nil: the Config's DType
	Policy           Policy // nil: a WindowPolicy for Config.Window > 0, else FullPolicy
}

// groups is cfg's layer groups: cfg.Groups with defaults filled in, or the
// one group the single-group fields describe.
func (c Config) groups() []GroupSpec {
	gs := c.Groups
	if len(gs) == 0 {
		layers := make([]int, c.NLayer)
		for i := range layers {
			layers[i] = i
		}
		gs = []GroupSpec{{Layers: layers, NKVHead: c.NKVHead, KDim: c.HeadDim, VDim: c.HeadDim}}
	} else {
		gs = append([]GroupSpec(nil), gs...)
	}
	for i := range gs {
		g := &gs[i]
		if g.KFormat == nil {
			g.KFormat = c.KFormat
		}
		if g.KFormat == nil {
			g.KFormat = c.DType
		}
		if g.VFormat == nil {
			g.VFormat = c.VFormat
		}
		if g.VFormat == nil {
			g.VFormat = c.DType
		}
		if g.Policy == nil {
			g.Policy = c.Policy
		}
		if g.Policy == nil {
			g.Policy = FullPolicy{}
			if c.Window > 0 {
				g.Policy = WindowPolicy{c.Window}
			}
		}
	}
	return gs
}

// blockBytes is the storage of one block of bs tokens over the group's layers.
func (g *GroupSpec) blockBytes(bs int) int64 {
	per := int64(bs*g.KFormat.RowBytes(g.NKVHead, g.KDim) + g.KFormat.PageMetaBytes(bs, g.NKVHead, g.KDim))
	if g.VDim > 0 {
		per += int64(bs*g.VFormat.RowBytes(g.NKVHead, g.VDim) + g.VFormat.PageMetaBytes(bs, g.NKVHead, g.VDim))
	}
	return per * int64(len(g.Layers))
}

// checkGroups validates the groups and maps each layer to its group.
func checkGroups(gs []GroupSpec) (layerGroup []int, err error) {
	n := 0
	for _, g := range gs {
		for _, l := range g.Layers {
			n = max(n, l+1)
		}
	}
	layerGroup = make([]int, n)
	for i := range layerGroup {
		layerGroup[i] = -1
	}
	for gi, g := range gs {
		if g.NKVHead <= 0 || g.KDim <= 0 || g.VDim < 0 || len(g.Layers) == 0 {
			return nil, fmt.Errorf("kvcache: bad shape: %d layers, %d kv heads, K dim %d, V dim %d", len(g.Layers), g.NKVHead, g.KDim, g.VDim)
		}
		if err := checkDim(g.KFormat, g.KDim); err != nil {
			return nil, err
		}
		if err := checkDim(g.VFormat, g.VDim); g.VDim > 0 && err != nil {
			return nil, err
		}
		for _, l := range g.Layers {
			if l < 0 || layerGroup[l] >= 0 {
				return nil, fmt.Errorf("kvcache: layer %d in no group or in two", l)
			}
			layerGroup[l] = gi
		}
	}
	for l, g := range layerGroup {
		if g < 0 {
			return nil, fmt.Errorf("kvcache: layer %d belongs to no group", l)
		}
	}
	return layerGroup, nil
}

// checkDim asks a format that constrains head dims (a block format must
// not split a block across heads) whether dim suits it, so a bad pairing
// fails at construction rather than panicking in NewPages.
func checkDim(f Format, dim int) error {
	if c, ok := f.(interface{ checkDim(int) error }); ok {
		return c.checkDim(dim)
	}
	return nil
}
