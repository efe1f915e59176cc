package ring

import "math/rand/v2"

// Problem and Reference64 let the external tests (which may import the
// model) use the float64 reference.
type Problem = problem

func NewProblem(r *rand.Rand, s Shape, start, T int) *Problem { return newProblem(r, s, start, T) }

func (p *problem) Q() []float32           { return p.q }
func (p *problem) K() []float32           { return p.k }
func (p *problem) V() []float32           { return p.v }
func (p *problem) Pos() []int32           { return p.pos }
func (p *problem) Block(lo, hi int) Block { return p.block(lo, hi) }
func (p *problem) Reference() []float64   { return p.reference() }

func (p *problem) ReferenceRows(rows []int) []float64 { return p.referenceRows(rows) }

func MaxErr(got []float32, want []float64) float64 { return maxErr(got, want) }
