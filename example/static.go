package main

import (
	"embed"
	"net/http"

	"github.com/go-chi/chi/v5"
)

// static holds the files the demo's pages load: their style sheet and the
// JavaScript client for fetch() callers. They are embedded so that the
// example stays one binary with nothing to install or build.
//
//go:embed static
var static embed.FS

// routeStatic serves static/* under /static/. "no-cache" makes browsers
// revalidate, so an edited file shows on the next load.
func routeStatic(r chi.Router) {
	files := http.FileServerFS(static)
	r.Get("/static/*", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
