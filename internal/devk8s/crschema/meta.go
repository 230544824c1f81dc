package crschema

import "time"

// plainMeta returns what decoding obj's metadata into an ObjectMeta and
// back (apiextensions' GetObjectMetaWithOptions then SetObjectMeta) gives
// when that round trip cannot fail, drop anything or report an unknown
// field: metadata holding only string names, identifiers and resource
// version, a non-zero int64 generation, string-valued labels and
// annotations and a creationTimestamp already in the form ObjectMeta
// writes. Empty strings, maps and a null creationTimestamp are dropped,
// as ObjectMeta's omitempty fields are. ok is false
// for anything else; the caller then takes the JSON round trip.
func plainMeta(obj map[string]any) (map[string]any, bool) {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		return nil, false
	}
	out := make(map[string]any, len(md)+1)
	for k, v := range md {
		switch k {
		case "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion":
			s, ok := v.(string)
			if !ok {
				return nil, false
			}
			if s != "" {
				out[k] = s
			}
		case "generation":
			n, ok := v.(int64)
			if !ok {
				return nil, false
			}
			if n != 0 {
				out[k] = n
			}
		case "labels", "annotations":
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			if len(m) == 0 {
				continue
			}
			c := make(map[string]any, len(m))
			for mk, mv := range m {
				s, ok := mv.(string)
				if !ok {
					return nil, false
				}
				c[mk] = s
			}
			out[k] = c
		case "creationTimestamp":
			if v == nil {
				continue
			}
			s, ok := v.(string)
			if !ok {
				return nil, false
			}
			t, err := time.Parse(time.RFC3339, s)
			if err != nil || t.IsZero() || t.UTC().Format(time.RFC3339) != s {
				return nil, false
			}
			out[k] = s
		default:
			return nil, false
		}
	}
	return out, true
}
