package config

import (
	"errors"
	"fmt"
	"maps"
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
	var ps Problems
	check(doc, reflect.TypeFor[Config](), "", &ps)
	if len(ps) > 0 {
		return Config{}, ps
	}
	if err := doc.Decode(&cfg); err != nil {
		// check above should have found it; say so with what yaml knows.
		return Config{}, Problems{{Message: err.Error()}}
	}
	cfg.applySourceDefaults()
	set, envProblems := cfg.applyEnv(lookup)
	if len(envProblems) > 0 {
		return cfg, envProblems
	}
	if err := cfg.Validate(); err != nil {
		var ps Problems
		if errors.As(err, &ps) && len(set) > 0 {
			blameEnv(ps, set)
		}
		return cfg, err
	}
	return cfg, nil
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// check walks node against type t and records, with its path, every key the
// schema does not have and every scalar that does not decode into its field.
func check(n *yaml.Node, t reflect.Type, path string, ps *Problems) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Tag == "!!null" {
		return // an empty value leaves the default in place
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		decodeLeaf(n, t, path, ps)
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		check(n, t.Elem(), path, ps)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			ps.add(path, "want a mapping, got %s", describe(n))
			return
		}
		fields := yamlFields(t)
		seen := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i].Value, n.Content[i+1]
			if line, dup := seen[key]; dup {
				ps.add(join(path, key), "duplicate key (first at line %d)", line)
				continue
			}
			seen[key] = n.Content[i].Line
			f, ok := fields[key]
			if !ok {
				ps.add(join(path, key), "unknown key (known: %s)", strings.Join(sortedKeys(fields), ", "))
				continue
			}
			check(val, f.Type, join(path, key), ps)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			ps.add(path, "want a list, got %s", describe(n))
			return
		}
		for i, item := range n.Content {
			check(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), ps)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			ps.add(path, "want a mapping, got %s", describe(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			check(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), ps)
		}
	default:
		decodeLeaf(n, t, path, ps)
	}
}

func decodeLeaf(n *yaml.Node, t reflect.Type, path string, ps *Problems) {
	if n.Kind != yaml.ScalarNode {
		ps.add(path, "want a single value, got %s", describe(n))
		return
	}
	v := reflect.New(t)
	if err := n.Decode(v.Interface()); err != nil {
		msg := err.Error()
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			msg = fmt.Sprintf("cannot use %q as %s", n.Value, kindName(t))
		}
		ps.add(path, "%s", strings.TrimPrefix(msg, "yaml: "))
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
