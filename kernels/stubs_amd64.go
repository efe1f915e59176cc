//go:build amd64 && !purego

package kernels

func setFloatAVX512() {}
func setFloatAVX2()   {}
