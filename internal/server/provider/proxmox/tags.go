package proxmox

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// TagPrefix starts every ownership tag: nstance-{key}.{value}, e.g.
// nstance-cluster.c1, nstance-instance.web-0a1b2c3d.
const TagPrefix = "nstance-"

// Ownership tag keys.
const (
	TagCluster  = "cluster"
	TagShard    = "shard"
	TagTenant   = "tenant"
	TagGroup    = "group"
	TagTemplate = "template"
	TagInstance = "instance"
)

// tagPattern is Proxmox VE's tag syntax (pve-tag): letters, digits, '_',
// '-', '+' and '.', not starting with '-', '+' or '.'. Proxmox compares
// tags case-insensitively by default, so the encoded values use no
// upper-case letters.
var tagPattern = regexp.MustCompile(`^[a-z0-9_][a-z0-9_+.-]*$`)

// ValidTag reports whether t is a tag Proxmox VE accepts (in lower case).
func ValidTag(t string) bool { return tagPattern.MatchString(t) }

// EncodeTagValue maps s to characters a tag may hold, reversibly and in
// lower case: a-z, 0-9, '-' and '.' stay; an upper-case letter becomes '+'
// and the letter in lower case; any other byte (including '_' and '+')
// becomes '_' and two hex digits.
func EncodeTagValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
			b.WriteByte(c)
		case c >= 'A' && c <= 'Z':
			b.WriteByte('+')
			b.WriteByte(c + ('a' - 'A'))
		default:
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return b.String()
}

// DecodeTagValue reverses EncodeTagValue.
func DecodeTagValue(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
			b.WriteByte(c)
		case c == '+':
			if i+1 >= len(s) || s[i+1] < 'a' || s[i+1] > 'z' {
				return "", fmt.Errorf("tag value %q: '+' at %d is not followed by a letter", s, i)
			}
			b.WriteByte(s[i+1] - ('a' - 'A'))
			i++
		case c == '_':
			if i+2 >= len(s) {
				return "", fmt.Errorf("tag value %q: '_' at %d is not followed by two hex digits", s, i)
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil || strings.ToLower(s[i+1:i+3]) != s[i+1:i+3] {
				return "", fmt.Errorf("tag value %q: '_' at %d is not followed by two lower-case hex digits", s, i)
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			return "", fmt.Errorf("tag value %q: byte %q at %d is not produced by the encoding", s, c, i)
		}
	}
	return b.String(), nil
}

// Tag is the ownership tag of key with value.
func Tag(key, value string) string { return TagPrefix + key + "." + EncodeTagValue(value) }

// Owner is what the ownership tags of a VM say.
type Owner struct {
	Cluster, Shard, Tenant, Group, Template, Instance string
}

// OwnerTags returns the ownership tags of o (its empty fields left out)
// and extra, sorted and without duplicates.
func OwnerTags(o Owner, extra []string) []string {
	set := map[string]bool{}
	for _, t := range extra {
		set[strings.ToLower(t)] = true
	}
	for _, kv := range []struct{ k, v string }{{TagCluster, o.Cluster}, {TagShard, o.Shard}, {TagTenant, o.Tenant},
		{TagGroup, o.Group}, {TagTemplate, o.Template}, {TagInstance, o.Instance}} {
		if kv.v != "" {
			set[Tag(kv.k, kv.v)] = true
		}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// ParseOwner reads the ownership tags among tags (others are ignored, as
// are ownership tags that do not decode: nobody but this package writes
// them).
func ParseOwner(tags []string) Owner {
	var o Owner
	for _, t := range tags {
		rest, ok := strings.CutPrefix(strings.ToLower(t), TagPrefix)
		if !ok {
			continue
		}
		key, enc, ok := strings.Cut(rest, ".")
		if !ok {
			continue
		}
		v, err := DecodeTagValue(enc)
		if err != nil {
			continue
		}
		switch key {
		case TagCluster:
			o.Cluster = v
		case TagShard:
			o.Shard = v
		case TagTenant:
			o.Tenant = v
		case TagGroup:
			o.Group = v
		case TagTemplate:
			o.Template = v
		case TagInstance:
			o.Instance = v
		}
	}
	return o
}

// SplitTags splits a Proxmox tag list (';' separated; ',' and spaces are
// accepted on input too).
func SplitTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}
