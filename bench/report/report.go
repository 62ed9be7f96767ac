// Package report is the JSON that bench/load writes and bench/chart reads,
// and the rewriting of the documentation's benchmark sections.
package report

// Report is what one run of the load driver measured.
type Report struct {
	Machine  string   `json:"machine"`
	Duration string   `json:"duration"`
	Conns    int      `json:"conns"`
	Results  []Result `json:"results"`
}

// Result is one workload's figures.
type Result struct {
	Name       string  `json:"name"`
	What       string  `json:"what"`
	Requests   int     `json:"requests"`
	Unexpected int     `json:"unexpected"`
	RPS        float64 `json:"rps"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
}
