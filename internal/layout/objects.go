package layout

import (
	"fmt"
	"slices"
	"strings"
)

// internalRoots are the top-level names (below the prefix) that hold
// Nstance's own state: cluster material and secrets, shard records,
// nonces, leases and revocations, shard configs and dynamic groups.
var internalRoots = []string{"cluster", "shard", "config", "groups"}

// InternalRoots lists the top-level names reserved for Nstance's own state.
func InternalRoots() []string { return slices.Clone(internalRoots) }

// CheckTemplateObject checks the key a template file of kind storage names,
// relative to the storage prefix: a plain object key (no leading or
// trailing slash, no empty, "." or ".." segment, no NUL) that is not under
// one of InternalRoots, compared without case so a case-insensitive file
// store cannot be used to reach them either. A template must never deliver
// Nstance's own state (secrets, instance records, nonces, leases) to an
// instance. The caller applies the store's own key rules to the full key.
func CheckTemplateObject(key string) error {
	if key == "" {
		return fmt.Errorf("empty object key")
	}
	if strings.ContainsRune(key, 0) {
		return fmt.Errorf("object key %q contains a NUL byte", key)
	}
	segs := strings.Split(key, "/")
	for _, seg := range segs {
		switch seg {
		case "":
			return fmt.Errorf("object key %q has an empty segment (leading, trailing or double slash)", key)
		case ".", "..":
			return fmt.Errorf("object key %q has a %q segment", key, seg)
		}
	}
	if slices.Contains(internalRoots, strings.ToLower(segs[0])) {
		return fmt.Errorf("object key %q is under %s/, which holds Nstance's own state; keep template objects elsewhere (e.g. files/...)", key, segs[0])
	}
	return nil
}
