// Package stacktest holds the differential tests of the middleware's seam
// with the stack around it: the same handler behind the same outer and
// inner layers (compression, timeouts, proxies, CORS, sessions, loggers,
// tracing, framework recoverers, the middleware itself twice), served with
// and without the middleware over HTTP/1.1, HTTP/2 over TLS and h2c, and
// the answers compared. It is a module of its own so that the layers it
// needs (gzhttp, chi, httpsnoop, otelhttp, gin, echo) never enter the
// module graph of a program that imports the library.
package stacktest
