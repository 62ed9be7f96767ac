package sqlidem

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf16"
	"unicode/utf8"
)

// The header column holds the answer's header as a JSON object of name to
// values, readable in any SQL client. JSON strings are UTF-8, and header
// values are bytes that need not be (RFC 9110 reads them as ISO-8859-1):
// a value that is not valid UTF-8 would come back with U+FFFD in place of
// its bytes. So every byte of a value (and of a name) is written as the character with
// its number (ISO-8859-1 into UTF-8), which JSON keeps, and read back
// byte for byte. And the JSON is written in ASCII alone, every other
// character as a \u escape, so that the column's character set cannot
// refuse it: MySQL's latin1 (which is cp1252) has no U+0080 to U+009F.
// ASCII, nearly every header, reads as itself.

func encodeHeader(h http.Header) ([]byte, error) {
	out := make(map[string][]string, len(h))
	for name, values := range h {
		latin := make([]string, len(values))
		for i, v := range values {
			latin[i] = bytesAsRunes(v)
		}
		out[bytesAsRunes(name)] = latin
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return asciiJSON(b), nil
}

// asciiJSON escapes every character of b beyond ASCII, all of them inside
// JSON strings, as \uXXXX (a surrogate pair above U+FFFF).
func asciiJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, r := range string(b) {
		switch {
		case r < utf8.RuneSelf:
			out = append(out, byte(r))
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}

func decodeHeader(data []byte) (http.Header, error) {
	var in map[string][]string
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, err
	}
	h := make(http.Header, len(in))
	for name, values := range in {
		raw := make([]string, len(values))
		for i, v := range values {
			raw[i] = runesAsBytes(v)
		}
		h[runesAsBytes(name)] = raw
	}
	return h, nil
}

// bytesAsRunes writes each byte of s as the rune of the same number.
func bytesAsRunes(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		ascii = ascii && s[i] < utf8.RuneSelf
	}
	if ascii {
		return s
	}
	b := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		b = utf8.AppendRune(b, rune(s[i]))
	}
	return string(b)
}

// runesAsBytes undoes bytesAsRunes. A rune above 255 cannot come from it
// (a row written by hand): it is kept as its UTF-8 bytes.
func runesAsBytes(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 256 {
			b = append(b, byte(r))
		} else {
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}
