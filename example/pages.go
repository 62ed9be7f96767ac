package main

import "html/template"

var homePage = template.Must(template.New("home").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Idempotent shop</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 40rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
form { display: grid; gap: .5rem; grid-template-columns: 8rem 1fr; align-items: center; margin: 1.5rem 0; }
button { grid-column: 2; justify-self: start; padding: .4rem 1.2rem; }
table { border-collapse: collapse; width: 100%; }
td, th { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #ddd; }
.hint { color: #555; }
</style>
</head>
<body>
<h1>Idempotent shop</h1>
<p class="hint">Double-click “Place order”, or go back and submit again: each form carries a one-time token, so it places one order at most.</p>
<form method="post" action="/orders">
  {{.Field}}
  <label for="item">Item</label><input id="item" name="item" value="Green tea" required maxlength="100">
  <label for="quantity">Quantity</label><input id="quantity" name="quantity" type="number" value="1" min="1" max="100" required>
  <button type="submit">Place order</button>
</form>
<h2>Orders ({{len .Orders}})</h2>
<table>
<tr><th>#</th><th>Item</th><th>Quantity</th><th>Placed</th></tr>
{{range .Orders}}<tr><td><a href="/orders/{{.ID}}">{{.ID}}</a></td><td>{{.Item}}</td><td>{{.Quantity}}</td><td>{{.CreatedAt.Format "15:04:05"}}</td></tr>
{{end}}</table>
</body>
</html>
`))

var orderPage = template.Must(template.New("order").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Order {{.ID}}</title>
<style>body { font: 16px/1.5 system-ui, sans-serif; max-width: 40rem; margin: 2rem auto; padding: 0 1rem; }</style>
</head>
<body>
<h1>Order {{.ID}} placed</h1>
<p>{{.Quantity}} × {{.Item}}, {{.Status}} at {{.CreatedAt.Format "15:04:05"}} UTC.</p>
<p><a href="/">Back to the shop</a></p>
</body>
</html>
`))
