package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
)

// canonicalJSON writes a JSON text in one canonical form: objects with
// their members sorted by name, no insignificant whitespace, strings as
// their decoded value written the one way encoding/json writes them, and
// numbers as their exact value (5e2, 500 and 500.0 are one number). This is
// RFC 8785's idea with one deliberate difference: RFC 8785 rounds numbers
// to doubles, so two account ids above 2^53 would compare equal and a key
// reused for another account would be replayed its answer; here they stay
// apart. An object with a repeated member name counts its last value, as
// encoding/json does.
func canonicalJSON(text []byte) ([]byte, error) {
	v, err := decodeJSON(text)
	if err != nil {
		return nil, err
	}
	return appendCanonical(nil, v)
}

// decodeJSON decodes one JSON text, keeping numbers as written.
func decodeJSON(text []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("idempotency: data after the JSON value")
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

func appendCanonical(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(v))
		for name := range v {
			names = append(names, name)
		}
		slices.Sort(names)
		b = append(b, '{')
		for i, name := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, name)
			b = append(b, ':')
			var err error
			if b, err = appendCanonical(b, v[name]); err != nil {
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
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}
