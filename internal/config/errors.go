package config

import (
	"fmt"
	"strings"

	"handoff.dev/handoff/internal/redact"
)

// Problem is one thing wrong with a config file, at a YAML path such as
// "sources[0].rabbitmq.url". Path is empty for problems with the whole file.
type Problem struct {
	Path    string
	Message string
	// Line is where in the file the problem is, or the nearest key above
	// it that the file has; 0 when not known (a config not read from a
	// file, a value from the environment).
	Line int
}

func (p Problem) String() string {
	s := p.Message
	if p.Path != "" {
		s = p.Path + ": " + s
	}
	if p.Line > 0 {
		s += fmt.Sprintf(" (line %d)", p.Line)
	}
	return s
}

// Problems is every problem found in a file. It is returned as an error by
// Parse, Load and Validate when non-empty.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// add records a problem. Its message is redacted: it may quote a value from
// the file, and a value in the wrong place can be a URL with a password.
func (ps *Problems) add(path, format string, args ...any) {
	ps.addAt(0, path, format, args...)
}

func (ps *Problems) addAt(line int, path, format string, args ...any) {
	*ps = append(*ps, Problem{Path: path, Message: redact.Text(fmt.Sprintf(format, args...)), Line: line})
}

func (ps Problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	return ps
}
