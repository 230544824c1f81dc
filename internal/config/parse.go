package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/tailscale/hujson"
)

// FieldError is one problem with one configuration key.
type FieldError struct {
	// Key is the dotted path of the key, e.g. "shard.bind.agent_addr".
	Key string
	// Reason says what is wrong.
	Reason string
}

func (e FieldError) Error() string {
	if e.Key == "" {
		return e.Reason
	}
	return e.Key + ": " + e.Reason
}

// Errors is every problem found in a document, in key order.
type Errors []FieldError

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// Check is an extra validation of a parsed, defaulted config whose problems
// are reported with the document's own (e.g. the provider registry's check
// of shard.infra.options, which this package cannot know).
type Check func(*Config) Errors

// Parse reads a JSONC document, rejects unknown keys and values of the wrong
// type, applies defaults and validates the result, then runs checks. On
// failure the error is an Errors value (or a syntax error naming line and
// column).
func Parse(data []byte, checks ...Check) (*Config, error) {
	std, err := hujson.Standardize(data)
	if err != nil {
		return nil, fmt.Errorf("config is not valid JSONC: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(std))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("config is not valid JSON: %w", err)
	}
	if _, ok := raw.(map[string]any); !ok {
		return nil, Errors{{Reason: "config must be a JSON object"}}
	}
	var errs Errors
	checkShape(&errs, "", raw, reflect.TypeOf(Config{}))
	if len(errs) > 0 {
		sortErrors(errs)
		return nil, errs
	}
	var cfg Config
	if err := json.Unmarshal(std, &cfg); err != nil {
		// checkShape accepts only what Unmarshal accepts; this is a bug guard.
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		es, ok := AsErrors(err)
		if !ok {
			return nil, err
		}
		errs = append(errs, es...)
	}
	for _, c := range checks {
		errs = append(errs, c(&cfg)...)
	}
	if len(errs) > 0 {
		sortErrors(errs)
		return nil, errs
	}
	return &cfg, nil
}

// DecodeBlock decodes a free-form block of the document (such as
// shard.infra.options) into out, a pointer to a struct whose fields carry
// json tags, as strictly as Parse: every unknown key and wrongly typed value
// is reported with its dotted path under path. Fields absent from the block
// keep the values out already holds (its defaults).
func DecodeBlock(path string, block map[string]any, out any) Errors {
	if len(block) == 0 {
		return nil
	}
	t := reflect.TypeOf(out)
	if t == nil || t.Kind() != reflect.Pointer {
		return Errors{{Key: path, Reason: fmt.Sprintf("cannot decode into %T", out)}}
	}
	data, err := json.Marshal(block)
	if err != nil {
		return Errors{{Key: path, Reason: err.Error()}}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return Errors{{Key: path, Reason: err.Error()}}
	}
	var errs Errors
	checkShape(&errs, path, raw, t.Elem())
	if len(errs) > 0 {
		sortErrors(errs)
		return errs
	}
	if err := json.Unmarshal(data, out); err != nil {
		return Errors{{Key: path, Reason: err.Error()}}
	}
	return nil
}

func sortErrors(errs Errors) {
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Key < errs[j].Key })
}

var durationType = reflect.TypeOf(Duration(0))

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

// checkShape walks the decoded document along the Go type and records every
// unknown key and wrongly typed value with its dotted path.
func checkShape(errs *Errors, path string, v any, t reflect.Type) {
	if v == nil {
		return // null leaves the zero value
	}
	bad := func(want string) {
		*errs = append(*errs, FieldError{Key: path, Reason: fmt.Sprintf("want %s, got %s", want, kindName(v))})
	}
	if t == durationType {
		s, ok := v.(string)
		if !ok {
			bad("a duration string such as \"30s\"")
			return
		}
		if _, err := time.ParseDuration(s); err != nil {
			*errs = append(*errs, FieldError{Key: path, Reason: fmt.Sprintf("invalid duration %q: %v", s, err)})
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		checkShape(errs, path, v, t.Elem())
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			bad("object")
			return
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
		keys := sortedKeys(obj)
		for _, k := range keys {
			ft, known := fields[k]
			if !known {
				*errs = append(*errs, FieldError{Key: join(path, k), Reason: "unknown key"})
				continue
			}
			checkShape(errs, join(path, k), obj[k], ft)
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			bad("object")
			return
		}
		if t.Elem().Kind() == reflect.Interface {
			return
		}
		for _, k := range sortedKeys(obj) {
			checkShape(errs, join(path, k), obj[k], t.Elem())
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			bad("array")
			return
		}
		for i, e := range arr {
			checkShape(errs, fmt.Sprintf("%s[%d]", path, i), e, t.Elem())
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad("string")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("boolean")
		}
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, ok := v.(json.Number)
		if !ok {
			bad("integer")
			return
		}
		if _, err := n.Int64(); err != nil {
			*errs = append(*errs, FieldError{Key: path, Reason: fmt.Sprintf("want integer, got %s", n)})
		}
	case reflect.Interface:
	default:
		*errs = append(*errs, FieldError{Key: path, Reason: "unsupported type " + t.String()})
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// AsErrors returns the field errors inside err, if any.
func AsErrors(err error) (Errors, bool) {
	var es Errors
	ok := errors.As(err, &es)
	return es, ok
}
