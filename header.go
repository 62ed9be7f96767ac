package idempotency

import (
	"encoding/binary"
	"errors"
	"strings"
)

// Stored headers are length-prefixed, so that a value may hold any byte (a
// reflected search term with a newline in it) and still come back as one
// value of one header: nothing in a value can be read as a separator.
//
//	0x01 (uvarint len, name, uvarint len, value)…
//
// The leading version byte can never start the line format that earlier
// versions wrote ("Name: value\n"), which is still read, so that records
// stored before an upgrade replay after it.
const headerFormat = 0x01

// encodeHeader writes name, value, … pairs in the stored format.
func encodeHeader(pairs []string) string {
	return string(appendHeader(make([]byte, 0, headerSize(pairs)), pairs))
}

// headerSize is the length of pairs in the stored format.
func headerSize(pairs []string) int {
	if len(pairs) == 0 {
		return 0
	}
	n := 1
	for _, s := range pairs {
		n += uvarintSize(uint64(len(s))) + len(s)
	}
	return n
}

// uvarintSize is how many bytes binary.AppendUvarint writes for x.
func uvarintSize(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// appendHeader appends pairs in the stored format to b.
func appendHeader(b []byte, pairs []string) []byte {
	if len(pairs) == 0 {
		return b
	}
	b = append(b, headerFormat)
	for _, s := range pairs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

var errCorruptHeader = errors.New("idempotency: corrupt stored header")

// decodeHeader reads what encodeHeader wrote, or the line format of earlier
// versions. The pairs are substrings of s.
func decodeHeader(s string) ([]string, error) {
	switch {
	case s == "":
		return nil, nil
	case s[0] != headerFormat:
		return decodeHeaderLines(s)
	}
	s = s[1:]
	pairs := make([]string, 0, 8)
	for s != "" {
		n, used := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
		if used <= 0 || n > uint64(len(s)-used) {
			return nil, errCorruptHeader
		}
		pairs = append(pairs, s[used:used+int(n)])
		s = s[used+int(n):]
	}
	if len(pairs)%2 != 0 {
		return nil, errCorruptHeader
	}
	for i := 0; i < len(pairs); i += 2 {
		if pairs[i] == "" {
			return nil, errCorruptHeader
		}
	}
	return pairs, nil
}

// decodeHeaderLines reads the "Name: value\n" lines of earlier versions.
func decodeHeaderLines(s string) ([]string, error) {
	pairs := make([]string, 0, 2*strings.Count(s, "\n"))
	for s != "" {
		line, rest, ok := strings.Cut(s, "\n")
		if !ok {
			return nil, errCorruptHeader
		}
		name, value, ok := strings.Cut(line, ": ")
		if !ok || name == "" {
			return nil, errCorruptHeader
		}
		pairs = append(pairs, name, value)
		s = rest
	}
	return pairs, nil
}
