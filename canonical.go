package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// canonicalJSON writes a JSON text in one canonical form: objects with
// their members sorted by name, no insignificant whitespace, strings as
// their decoded value written the one way encoding/json writes them, and
// numbers as their exact value (5e2, 500 and 500.0 are one number). This is
// RFC 8785's idea with two deliberate differences. RFC 8785 rounds numbers
// to doubles, so two account ids above 2^53 would compare equal and a key
// reused for another account would be replayed its answer; here they stay
// apart. And encoding/json matches member names to struct fields whatever
// their case, the last match winning, and decodes a repeated object member
// into the same struct again: {"amount":5,"Amount":500} and
// {"Amount":500,"amount":5} are different requests to a Go handler. So in
// an object where two names fold to one (see foldName), repeated names
// included, members of one folded name keep their order and every one of
// them is kept; only members of different folded names are sorted.
func canonicalJSON(text []byte) ([]byte, error) {
	v, err := decodeJSON(text)
	if err != nil {
		return nil, err
	}
	return appendCanonical(nil, v)
}

// A jsonObject is a decoded JSON object as written: every member, in
// order, repeated names included. A map would keep only the last of a
// repeated name and lose the order of names that differ in case, both of
// which decide what encoding/json makes of the object.
type jsonObject []jsonMember

type jsonMember struct {
	name  string
	value any
}

// MarshalJSON writes the object's members as they came, in order.
func (o jsonObject) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.name)
		b = append(b, ':')
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b = append(b, v...)
	}
	return append(b, '}'), nil
}

// maxJSONDepth is encoding/json's own limit of nesting: a text it refuses
// to decode is not JSON here either.
const maxJSONDepth = 10000

// decodeJSON decodes one JSON text: objects as jsonObject, arrays as []any,
// numbers as json.Number, as written.
func decodeJSON(text []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("idempotency: data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return tok, nil // string, json.Number, bool or nil
	}
	if depth++; depth > maxJSONDepth {
		return nil, errors.New("idempotency: JSON nested too deep")
	}
	var v any
	switch delim {
	case '{':
		obj := jsonObject{}
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			value, err := decodeValue(dec, depth)
			if err != nil {
				return nil, err
			}
			obj = append(obj, jsonMember{name.(string), value})
		}
		v = obj
	case '[':
		arr := []any{}
		for dec.More() {
			item, err := decodeValue(dec, depth)
			if err != nil {
				return nil, err
			}
			arr = append(arr, item)
		}
		v = arr
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return nil, err
	}
	return v, nil
}

// jsonAt returns the value that a path of member names reaches through
// nested objects of v, and whether it is there.
func jsonAt(v any, path []string) (any, bool) {
	for _, name := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = obj[name]; !ok {
			return nil, false
		}
	}
	return v, true
}

// A selection is how a path of member names reaches into a decoded value.
type selection int

const (
	selectedAbsent    selection = iota // a step names no member, in any case
	selectedExact                      // every step names one member, in its exact case
	selectedAmbiguous                  // a step names a member twice, or in another case
)

// jsonSelect follows path through the jsonObjects of v as encoding/json
// would: a step names every member whose name folds to the step's. When
// each step names one member by its exact name it returns that member's
// value. When a step names none, nothing. Otherwise which value a handler
// sees depends on how it decodes, and it returns every member the path
// reaches, in order, for the fingerprint to tell such requests apart.
func jsonSelect(v any, path []string) (any, selection) {
	found := v
	for _, name := range path {
		obj, ok := found.(jsonObject)
		if !ok {
			return nil, selectedAbsent
		}
		key, n := foldName(name), 0
		for _, m := range obj {
			if foldName(m.name) != key {
				continue
			}
			if n++; n > 1 || m.name != name {
				return prune(v, path), selectedAmbiguous
			}
			found = m.value
		}
		if n == 0 {
			return nil, selectedAbsent
		}
	}
	return found, selectedExact
}

// prune keeps of v only the members that path reaches, by folded name.
func prune(v any, path []string) any {
	obj, ok := v.(jsonObject)
	if len(path) == 0 || !ok {
		return v
	}
	key := foldName(path[0])
	kept := jsonObject{}
	for _, m := range obj {
		if foldName(m.name) == key {
			kept = append(kept, jsonMember{m.name, prune(m.value, path[1:])})
		}
	}
	return kept
}

// foldName is the name under which a JSON decoder may take a member for
// another: encoding/json matches names to fields by Unicode simple case
// folding, and encoding/json/v2's case-insensitive matching also ignores
// '-' and '_'. This folds by both: names it folds apart, neither decoder
// confuses.
func foldName(name string) string {
	if !needsFolding(name) {
		return name
	}
	var b strings.Builder
	for _, r := range name {
		switch {
		case r == '_' || r == '-':
		case 'a' <= r && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		default:
			b.WriteRune(foldRune(r))
		}
	}
	return b.String()
}

// needsFolding reports whether foldName changes name: most names are
// already folded or hold a lowercase ASCII letter at once.
func needsFolding(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= utf8.RuneSelf || c == '_' || c == '-' || 'a' <= c && c <= 'z' {
			return true
		}
	}
	return false
}

// foldRune is the smallest rune of r's simple case folding orbit, as
// encoding/json folds.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

func appendCanonical(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case jsonObject:
		members := sortMembers(v)
		b = append(b, '{')
		for i, m := range members {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, m.name)
			b = append(b, ':')
			var err error
			if b, err = appendCanonical(b, m.value); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case []any:
		b = append(b, '[')
		for i, item := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendCanonical(b, item); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case json.Number:
		return appendNumber(b, string(v))
	case string:
		return appendString(b, v), nil
	}
	// true, false, null
	out, err := json.Marshal(v)
	return append(b, out...), err
}

// sortMembers orders an object's members for its canonical form: by name,
// when no two names fold to one; otherwise by folded name, members of one
// folded name in the order they came, since that order decides what a
// decoder makes of them.
func sortMembers(obj jsonObject) []jsonMember {
	type folded struct {
		key string
		jsonMember
	}
	members := make([]folded, len(obj))
	for i, m := range obj {
		members[i] = folded{foldName(m.name), m}
	}
	slices.SortStableFunc(members, func(a, b folded) int { return strings.Compare(a.key, b.key) })
	ambiguous := false
	for i := 1; i < len(members); i++ {
		ambiguous = ambiguous || members[i].key == members[i-1].key
	}
	if !ambiguous {
		slices.SortFunc(members, func(a, b folded) int { return strings.Compare(a.name, b.name) })
	}
	sorted := make([]jsonMember, len(members))
	for i, m := range members {
		sorted[i] = m.jsonMember
	}
	return sorted
}

// appendNumber writes a JSON number literal as its exact value: the
// significant digits, without leading or trailing zeros, and a power of
// ten ("5e2" for 500, 5e2 and 500.0; "1e-1" for 0.1; "0" for any zero).
func appendNumber(b []byte, lit string) ([]byte, error) {
	neg := strings.HasPrefix(lit, "-")
	lit = strings.TrimPrefix(lit, "-")
	mantissa, exponent, _ := strings.Cut(strings.ToLower(lit), "e")
	whole, frac, _ := strings.Cut(mantissa, ".")
	exp := int64(0)
	if exponent != "" {
		var err error
		if exp, err = strconv.ParseInt(exponent, 10, 32); err != nil {
			return nil, errors.New("idempotency: number exponent out of range")
		}
	}
	digits := strings.TrimLeft(whole+frac, "0")
	exp -= int64(len(frac))
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	if trimmed == "" {
		return append(b, '0'), nil
	}
	if neg {
		b = append(b, '-')
	}
	b = append(b, trimmed...)
	if exp != 0 {
		b = append(b, 'e')
		b = strconv.AppendInt(b, exp, 10)
	}
	return b, nil
}

func appendString(b []byte, s string) []byte {
	if plainASCII(s) { // most strings: encoding/json would write them as they are
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// plainASCII reports whether encoding/json writes s unescaped: printable
// ASCII without a quote or a backslash.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
