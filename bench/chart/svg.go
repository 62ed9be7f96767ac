package main

import (
	"fmt"
	"html"
	"strings"
)

// drawSVG draws one bar per workload: throughput as a share of the bare
// handler's, labelled with the absolute figures.
func drawSVG(rep Report) string {
	const (
		width, left, right = 900, 110, 320
		barH, gap, top     = 26, 12, 56
	)
	height := top + len(rep.Results)*(barH+gap) + 8
	bare := rep.Results[0].RPS
	plot := float64(width - left - right)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, sans-serif" font-size="13">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="600">Throughput relative to the bare handler (higher is better)</text>`+"\n", left)
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#555">%d connections, %s per workload; %s</text>`+"\n", left, rep.Conns, rep.Duration, html.EscapeString(rep.Machine))
	for i, r := range rep.Results {
		y := top + i*(barH+gap)
		w := plot * r.RPS / bare
		if w > plot {
			w = plot
		}
		color := "#4c78a8"
		if r.Name == "bare" {
			color = "#9d9d9d"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+barH/2+5, html.EscapeString(r.Name))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y, w, barH, color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.0f req/s (%.0f%%), p50 %.2f ms, p99 %.2f ms</text>`+"\n",
			float64(left)+w+6, y+barH/2+5, r.RPS, 100*r.RPS/bare, r.P50ms, r.P99ms)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", left, top-4, left, height-8)
	b.WriteString("</svg>\n")
	return b.String()
}
