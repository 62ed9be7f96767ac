package report

import (
	"fmt"
	"os"
	"strings"
)

// ReplaceSection rewrites the part of the file at path between the marker
// lines begin and end with section, keeping the markers: how bench/chart
// and bench/sidebyside update the benchmark tables of the documentation.
func ReplaceSection(path, begin, end, section string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text := string(data)
	b, e := strings.Index(text, begin), strings.Index(text, end)
	if b < 0 || e < b {
		return fmt.Errorf("%s has no %s … %s section", path, begin, end)
	}
	text = text[:b+len(begin)] + "\n" + section + text[e:]
	return os.WriteFile(path, []byte(text), 0o644)
}
