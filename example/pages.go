package main

import (
	"html/template"
	"strconv"
	"time"
)

var pageFuncs = template.FuncMap{
	"ago":                ago,
	"protectionDisabled": protectionDisabled,
}

// homePage is the order form, the orders placed so far and a button that
// sends one payment twice through the JavaScript client. A form submission
// ends in a redirect the browser follows, so the page cannot show that an
// answer was replayed; what it can show is that the count of orders went up
// by one. The payment button shows the replay itself: fetch() sees the
// Idempotent-Replayed header.
var homePage = template.Must(template.New("home").Funcs(pageFuncs).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Idempotent shop</title>
<link rel="stylesheet" href="/static/shop.css">
</head>
<body>
<h1>Idempotent shop</h1>
<p class="try">Double-click “Place order”, reload the order page or go back and submit again, or open a second tab: each form carries a one-time token, so it places one order however often it is sent.</p>
{{if protectionDisabled}}<p class="warning" id="unprotected"><strong>Protection is off.</strong> <code>IDEMPOTENCY_DISABLED=1</code> is a demo switch: the order form runs without the middleware, so a double click places two orders.</p>
{{end}}<form class="order" method="post" action="/orders">
  {{.Field}}
  <label for="item">Item</label><input id="item" name="item" value="Green tea" required maxlength="100">
  <label for="quantity">Quantity</label><input id="quantity" name="quantity" type="number" value="1" min="1" max="100" required>
  <button type="submit">Place order</button>
</form>
<h2>Orders placed <span class="count" id="order-count">{{len .Orders}}</span></h2>
{{if .Orders}}<table id="orders">
<tr><th>#</th><th>Item</th><th class="num">Quantity</th><th>Status</th><th>Placed (UTC)</th></tr>
{{range .Orders}}<tr><td><a href="/orders/{{.ID}}">{{.ID}}</a></td><td>{{.Item}}</td><td class="num">{{.Quantity}}</td><td>{{.Status}}</td><td>{{.CreatedAt.Format "15:04:05"}}</td></tr>
{{end}}</table>
{{else}}<p class="empty">None yet.</p>
{{end}}<h2>From an API client</h2>
<p class="try">Scripts use <a href="/static/idempotent-fetch.js"><code>idempotent-fetch.js</code></a>: one key per payment, sent again with every retry.</p>
<p><button id="pay" type="button" disabled>Send one payment twice</button></p>
<ol class="answers" id="answers"></ol>
<script type="module">
import { idempotentFetch, newKey, REPLAYED_HEADER } from '/static/idempotent-fetch.js';
const answers = document.getElementById('answers');
const pay = document.getElementById('pay');
pay.disabled = false; // enabled once this script can answer the click
pay.addEventListener('click', async () => {
  const key = await newKey(); // one payment, one key: both sends carry it
  for (let i = 0; i < 2; i++) {
    const res = await idempotentFetch('/payments', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ amount: 500, currency: 'EUR' }) }, { key });
    const p = await res.json();
    const li = answers.appendChild(document.createElement('li'));
    li.textContent = res.status + ' ' + (p.id ? 'payment ' + p.id + ' ' + p.status : p.detail) + ' ';
    if (res.headers.get(REPLAYED_HEADER) === 'true') li.appendChild(document.createElement('mark')).textContent = 'replayed';
  }
});
</script>
</body>
</html>
`))

// orderPage is where a submitted form lands, the first time and after any
// resubmission of that form alike (the redirect is part of the replayed
// answer), so it says when the order was placed: a resubmission visibly
// lands on an order placed earlier, not on a new one.
var orderPage = template.Must(template.New("order").Funcs(pageFuncs).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Order {{.ID}}</title>
<link rel="stylesheet" href="/static/shop.css">
</head>
<body>
<h1 id="order">Order {{.ID}} placed</h1>
<p>{{.Quantity}} × {{.Item}}, at {{.CreatedAt.Format "15:04:05"}} UTC ({{ago .CreatedAt}}){{if ne .Status "placed"}}; now {{.Status}}{{end}}.</p>
<p class="try">Sent this form again? You land here again: the duplicate got this order’s first answer replayed, and no second order was placed.</p>
<p><a href="/">Back to the shop</a></p>
</body>
</html>
`))

// ago says how long ago t was, coarsely: a reader compares it with "just
// now", not with a stopwatch.
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + " s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min ago"
	}
	return strconv.Itoa(int(d/time.Hour)) + " h ago"
}
