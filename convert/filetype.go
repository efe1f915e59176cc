// Package convert turns model files into GGUF and quantizes GGUF files the
// way llama.cpp's llama-quantize does: the same per-tensor type choices
// (llama_tensor_get_type and its mixes), the same fallbacks for odd row
// lengths, the same general.file_type numbering, and, through package quant,
// the same bytes.
package convert

import (
	"fmt"
	"strconv"
	"strings"

	"pagoda/quant"
)

// fileType is one llama_ftype: what general.file_type records and which
// mix of tensor types it stands for.
type fileType struct {
	id   uint32
	name string     // llama-quantize's name for it
	base quant.Type // llama_ftype_get_default_type
	mix  string     // "", "S", "M" or "L"
	// imatrix marks file types llama-quantize refuses without an importance
	// matrix; Pagoda has none to give.
	imatrix bool
}

// LLAMA_FTYPE numbers (llama.h). The gaps are types llama.cpp retired.
var fileTypes = []fileType{
	{0, "F32", quant.F32, "", false},
	{1, "F16", quant.F16, "", false},
	{2, "Q4_0", quant.Q4_0, "", false},
	{3, "Q4_1", quant.Q4_1, "", false},
	{7, "Q8_0", quant.Q8_0, "", false},
	{8, "Q5_0", quant.Q5_0, "", false},
	{9, "Q5_1", quant.Q5_1, "", false},
	{10, "Q2_K", quant.Q2_K, "", false},
	{11, "Q3_K_S", quant.Q3_K, "S", false},
	{12, "Q3_K_M", quant.Q3_K, "M", false},
	{13, "Q3_K_L", quant.Q3_K, "L", false},
	{14, "Q4_K_S", quant.Q4_K, "S", false},
	{15, "Q4_K_M", quant.Q4_K, "M", false},
	{16, "Q5_K_S", quant.Q5_K, "S", false},
	{17, "Q5_K_M", quant.Q5_K, "M", false},
	{18, "Q6_K", quant.Q6_K, "", false},
	{19, "IQ2_XXS", quant.IQ2_XXS, "", true},
	{20, "IQ2_XS", quant.IQ2_XS, "", true},
	{21, "Q2_K_S", quant.Q2_K, "S", true},
	{23, "IQ3_XXS", quant.IQ3_XXS, "", true},
	{24, "IQ1_S", quant.IQ1_S, "", true},
	{25, "IQ4_NL", quant.IQ4_NL, "", false},
	{30, "IQ4_XS", quant.IQ4_XS, "", false},
	{31, "IQ1_M", quant.IQ1_M, "", true},
	{32, "BF16", quant.BF16, "", false},
}

// Named llama_ftype values the mix rules test.
const (
	ftQ2_K   = 10
	ftQ3_K_S = 11
	ftQ3_K_M = 12
	ftQ3_K_L = 13
	ftQ4_K_S = 14
	ftQ4_K_M = 15
	ftQ5_K_S = 16
	ftQ5_K_M = 17
	ftQ4_0   = 2
	ftQ5_0   = 8
	ftIQ4_NL = 25
	ftIQ4_XS = 30
)

// defaultMix is the mix llama-quantize picks for a bare K-quant name:
// "Q4_K" is an alias of Q4_K_M, and likewise for Q3_K and Q5_K.
func defaultMix(t quant.Type) string {
	switch t {
	case quant.Q3_K, quant.Q4_K, quant.Q5_K:
		return "M"
	}
	return ""
}

func supportedNames() string {
	var s []string
	for _, ft := range fileTypes {
		if !ft.imatrix {
			s = append(s, ft.name)
		}
	}
	return strings.Join(s, ", ")
}

// ParseFileType reads a llama-quantize type name ("Q4_K_M", "q8_0", "F16",
// "Q4_K", or a LLAMA_FTYPE number such as "15") and returns the tensor type
// and the mix suffix ("S", "M", "L" or ""), ready for QuantizeOptions. A bare
// "Q3_K", "Q4_K" or "Q5_K" means the M mix, as in llama-quantize.
func ParseFileType(s string) (quant.Type, string, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	name = strings.ReplaceAll(name, "-", "_")
	var ft *fileType
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		for i := range fileTypes {
			if uint64(fileTypes[i].id) == n {
				ft = &fileTypes[i]
			}
		}
	} else {
		for i := range fileTypes {
			f := &fileTypes[i]
			if f.name == name || (f.mix == "M" && strings.TrimSuffix(f.name, "_M") == name) {
				ft = f
			}
		}
	}
	if ft == nil {
		return 0, "", fmt.Errorf("convert: unknown quantization type %q (supported: %s)", s, supportedNames())
	}
	if ft.imatrix {
		return 0, "", fmt.Errorf("convert: quantization type %s needs an importance matrix, which Pagoda does not compute (supported: %s)", ft.name, supportedNames())
	}
	return ft.base, ft.mix, nil
}

// resolveFileType finds the llama_ftype for a target type and mix and
// reports whether the mix is "pure".
func resolveFileType(t quant.Type, mix string) (*fileType, bool, error) {
	m := strings.ToUpper(strings.TrimSpace(mix))
	pure := m == "PURE"
	if pure || m == "" {
		m = defaultMix(t)
	}
	var match *fileType
	for i := range fileTypes {
		if fileTypes[i].base == t && fileTypes[i].mix == m {
			match = &fileTypes[i]
			break
		}
	}
	if match == nil {
		for i := range fileTypes {
			if fileTypes[i].base == t {
				return nil, false, fmt.Errorf("type %s has no mix %q", t, mix)
			}
		}
		return nil, false, fmt.Errorf("cannot quantize to type %s (supported: %s)", t, supportedNames())
	}
	if match.imatrix {
		return nil, false, fmt.Errorf("quantization type %s needs an importance matrix, which Pagoda does not compute", match.name)
	}
	return match, pure, nil
}

// FileTypeName is llama-quantize's name for a general.file_type value
// ("Q4_K_M", "F16"), or "" for a number it does not know.
func FileTypeName(id uint32) string {
	for _, ft := range fileTypes {
		if ft.id == id {
			return ft.name
		}
	}
	return ""
}
