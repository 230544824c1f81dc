package crschema

import (
	"maps"
	"time"
)

// plainMeta returns what decoding obj's metadata into an ObjectMeta and
// back (apiextensions' GetObjectMetaWithOptions then SetObjectMeta) gives
// when that round trip cannot fail, drop anything or report an unknown
// field: metadata holding only string names, identifiers and resource
// version, a non-zero int64 generation, string-valued labels and
// annotations and a creationTimestamp already in the form ObjectMeta
// writes. Empty strings, maps and a null creationTimestamp are dropped,
// as ObjectMeta's omitempty fields are. ok is false
// for anything else; the caller then takes the JSON round trip.
//
// When nothing is dropped the round trip gives equal metadata, and the
// metadata itself is returned.
func plainMeta(obj map[string]any) (map[string]any, bool) {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		return nil, false
	}
	same := true
	for k, v := range md {
		keep, ok := plainField(k, v)
		if !ok {
			return nil, false
		}
		same = same && keep
	}
	if same {
		return md, true
	}
	out := make(map[string]any, len(md))
	for k, v := range md {
		if keep, _ := plainField(k, v); !keep {
			continue
		}
		if m, ok := v.(map[string]any); ok {
			v = maps.Clone(m)
		}
		out[k] = v
	}
	return out, true
}

// plainField reports whether a metadata field is one plainMeta handles
// (ok) and whether the round trip keeps it (keep).
func plainField(k string, v any) (keep, ok bool) {
	switch k {
	case "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion":
		s, ok := v.(string)
		return s != "", ok
	case "generation":
		n, ok := v.(int64)
		return n != 0, ok
	case "labels", "annotations":
		m, ok := v.(map[string]any)
		if !ok {
			return false, false
		}
		for _, mv := range m {
			if _, ok := mv.(string); !ok {
				return false, false
			}
		}
		return len(m) > 0, true
	case "creationTimestamp":
		if v == nil {
			return false, true
		}
		s, ok := v.(string)
		if !ok {
			return false, false
		}
		t, err := time.Parse(time.RFC3339, s)
		var buf [40]byte
		if err != nil || t.IsZero() || string(t.UTC().AppendFormat(buf[:0], time.RFC3339)) != s {
			return false, false
		}
		return true, true
	}
	return false, false
}
