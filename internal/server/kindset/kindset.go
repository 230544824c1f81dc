// Package kindset is the name-to-kind table behind the server's registries
// of instance providers and load balancer kinds: built once by the server's
// assembly with the kinds the binary ships, only read afterwards.
package kindset

import (
	"fmt"
	"slices"
	"sort"
)

// Set maps kind names to kinds.
type Set[K any] struct {
	kinds map[string]K
}

// New returns the set of kinds, each named by name(k). An empty name, a
// kind valid rejects or two kinds with one name are programming errors and
// panic; what names the registry (e.g. "provider") starts the message.
func New[K any](what string, name func(K) string, valid func(K) bool, kinds ...K) Set[K] {
	s := Set[K]{kinds: make(map[string]K, len(kinds))}
	for _, k := range kinds {
		n := name(k)
		if n == "" || !valid(k) {
			panic(fmt.Sprintf("%s: kind %q has no name or no Config", what, n))
		}
		if _, dup := s.kinds[n]; dup {
			panic(fmt.Sprintf("%s: kind %q registered twice", what, n))
		}
		s.kinds[n] = k
	}
	return s
}

// Names returns the kind names, sorted.
func (s Set[K]) Names() []string {
	names := make([]string, 0, len(s.kinds))
	for n := range s.kinds {
		names = append(names, n)
	}
	sort.Strings(names)
	return slices.Clip(names)
}

// Get returns the kind named n.
func (s Set[K]) Get(n string) (K, bool) {
	k, ok := s.kinds[n]
	return k, ok
}
