package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads, decodes and validates the file at path. A file that cannot be
// read is an error naming the file; a file with problems returns Problems.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Parse(data)
}

// Parse decodes and validates a YAML document over the defaults.
//
// Decoding is strict: every unknown key and every value of the wrong type is
// reported with its YAML path, all at once, before any is decoded.
func Parse(data []byte) (Config, error) { return parse(data, nil) }

// parse is Parse with the environment's overrides (env.go) when lookup is
// not nil.
func parse(data []byte, lookup func(string) (string, bool)) (Config, error) {
	cfg := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, Problems{{Message: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return Config{}, Problems{{Message: "empty config file"}}
	}
	doc := root.Content[0]
	// One pass: what does not decode is reported and left at its default,
	// so that the rest is decoded and validated too, and every problem is
	// said at once, each with its line.
	c := checker{lines: map[string]int{}}
	c.check(doc, reflect.TypeFor[Config](), "")
	ps := c.ps
	if err := doc.Decode(&cfg); err != nil {
		// check above should have found it; say so with what yaml knows.
		return Config{}, append(ps, Problem{Message: err.Error()})
	}
	cfg.applySourceDefaults()
	set, envProblems := cfg.applyEnv(lookup)
	ps = append(ps, envProblems...)
	if len(envProblems) == 0 {
		if err := cfg.Validate(); err != nil {
			var vps Problems
			if !errors.As(err, &vps) {
				return cfg, err
			}
			if len(set) > 0 {
				blameEnv(vps, set)
			}
			for _, p := range vps {
				if !reported(ps, p.Path) {
					p.Line = c.lineOf(p.Path)
					ps = append(ps, p)
				}
			}
		}
	}
	if len(ps) > 0 {
		// In the file's order; what no line names (the environment's),
		// last.
		slices.SortStableFunc(ps, func(a, b Problem) int {
			return cmp.Compare(lineOrder(a.Line), lineOrder(b.Line))
		})
		return cfg, ps
	}
	return cfg, nil
}

func lineOrder(l int) int {
	if l == 0 {
		return math.MaxInt
	}
	return l
}

// reported reports whether ps already has a problem at path, or above or
// below it: a value that did not decode is not reported again for the
// default left in its place.
func reported(ps Problems, path string) bool {
	for _, p := range ps {
		if p.Path == path || strings.HasPrefix(path, p.Path+".") || strings.HasPrefix(path, p.Path+"[") ||
			strings.HasPrefix(p.Path, path+".") || strings.HasPrefix(p.Path, path+"[") {
			return true
		}
	}
	return false
}

// checker walks the document against the schema.
type checker struct {
	ps Problems
	// lines is the line of every path the file has.
	lines map[string]int
}

// lineOf is the line of path in the file, or of the nearest key above it
// there: a missing key's problem points at its parent.
func (c *checker) lineOf(path string) int {
	for path != "" {
		if l, ok := c.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// check walks node against type t and records, with its path and line,
// every key the schema does not have and every scalar that does not decode
// into its field; such a scalar is made null, so that decoding the document
// leaves the default in its place.
func (c *checker) check(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if path != "" {
		c.lines[path] = n.Line
	}
	if n.Tag == "!!null" {
		return // an empty value leaves the default in place
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		c.decodeLeaf(n, t, path)
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		c.check(n, t.Elem(), path)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.ps.addAt(n.Line, path, "want a mapping, got %s", describe(n))
			nullify(n)
			return
		}
		fields := yamlFields(t)
		seen := make(map[string]int, len(n.Content)/2)
		kept := n.Content[:0:0]
		defer func() { n.Content = kept }() // without the duplicates, which do not decode
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			key := k.Value
			if line, dup := seen[key]; dup {
				c.ps.addAt(k.Line, join(path, key), "duplicate key (first at line %d)", line)
				continue
			}
			kept = append(kept, k, val)
			seen[key] = k.Line
			f, ok := fields[key]
			if !ok {
				c.ps.addAt(k.Line, join(path, key), "unknown key (known: %s)", strings.Join(sortedKeys(fields), ", "))
				continue
			}
			c.check(val, f.Type, join(path, key))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.ps.addAt(n.Line, path, "want a list, got %s", describe(n))
			nullify(n)
			return
		}
		for i, item := range n.Content {
			c.check(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			c.ps.addAt(n.Line, path, "want a mapping, got %s", describe(n))
			nullify(n)
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			c.check(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	default:
		c.decodeLeaf(n, t, path)
	}
}

// nullify makes n an empty value, which decodes to nothing.
func nullify(n *yaml.Node) {
	*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
}

func (c *checker) decodeLeaf(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		c.ps.addAt(n.Line, path, "want a single value, got %s", describe(n))
		nullify(n)
		return
	}
	v := reflect.New(t)
	if err := n.Decode(v.Interface()); err != nil {
		msg := err.Error()
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			msg = fmt.Sprintf("cannot use %q as %s", n.Value, kindName(t))
		}
		c.ps.addAt(n.Line, path, "%s", strings.TrimPrefix(msg, "yaml: "))
		nullify(n)
	}
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	fields := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
			// An inlined struct's keys are the outer struct's.
			maps.Copy(fields, yamlFields(f.Type))
			continue
		}
		if name != "" && name != "-" {
			fields[name] = f
		}
	}
	return fields
}

func sortedKeys(m map[string]reflect.StructField) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return t.String()
}
