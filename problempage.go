package idempotency

import (
	"html"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A browser that submits a form and is refused shows the refusal to a
// person: DefaultErrorHandler answers a request that prefers HTML to JSON
// (a navigation, whose Accept lists text/html first) with a page of the
// problem's title and detail, under the same status and headers, rather
// than the problem+json that an API client reads.

// prefersHTML reports whether r's Accept header names text/html before any
// JSON type. Browsers list text/html first for a navigation; fetch and API
// clients send */* or JSON. Quality values are not weighed: a client that
// lists text/html first and JSON after with a higher q is rare enough to
// get the page.
func prefersHTML(r *http.Request) bool {
	if r == nil {
		return false
	}
	accept := r.Header.Get("Accept")
	page := strings.Index(accept, "text/html")
	if page < 0 {
		return false
	}
	json := strings.Index(accept, "json")
	return json < 0 || page < json
}

// problemPage is a problem's page, cut where the retry advice goes.
type problemPage struct{ head, tail string }

func newProblemPage(p *problem) problemPage {
	title := html.EscapeString(p.title)
	return problemPage{
		head: `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>` + title + `</title></head>
<body><h1>` + title + `</h1>
<p>` + html.EscapeString(p.detail) + `</p>
`,
		tail: `<p><small>` + strconv.Itoa(p.status) + ` <a href="` + html.EscapeString(ProblemTypeBase+p.slug) + `">` +
			html.EscapeString(p.slug) + `</a></small></p></body></html>
`,
	}
}

// page is p's page; after, when positive, says when to try again.
func (p *problem) page(after time.Duration) []byte {
	var advice string
	if after > 0 {
		seconds := retryAfterSeconds(after)
		unit := " seconds"
		if seconds == "1" {
			unit = " second"
		}
		advice = "<p>Try again in " + seconds + unit +
			": go back and submit the form again, or reload this page.</p>\n"
	}
	return []byte(p.html.head + advice + p.html.tail)
}
