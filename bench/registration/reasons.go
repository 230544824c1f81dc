package main

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/go-logr/logr"
)

// reasons is a logr sink that keeps only what explains a refused or failed
// registration: the "reason" of the server's "registration refused" lines
// and the text of its error lines, counted. The bench prints them, so an
// Unavailable answer under load names its storage or provider cause.
type reasons struct {
	mu     sync.Mutex
	counts map[string]int
}

func newReasons() *reasons { return &reasons{counts: map[string]int{}} }

func (r *reasons) logger() logr.Logger { return logr.New(&reasonSink{r: r}) }

func (r *reasons) add(s string) {
	r.mu.Lock()
	r.counts[s]++
	r.mu.Unlock()
}

// errors returns the error lines seen (refusals left out).
func (r *reasons) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for k := range r.counts {
		if strings.HasPrefix(k, "error: ") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// print writes the reasons seen, most frequent first.
func (r *reasons) print() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.counts) == 0 {
		return
	}
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.counts[keys[i]] > r.counts[keys[j]] })
	fmt.Println("server-side refusals and errors:")
	for _, k := range keys {
		fmt.Printf("  %6d  %s\n", r.counts[k], k)
	}
}

type reasonSink struct {
	r      *reasons
	values []any
}

func (s *reasonSink) Init(logr.RuntimeInfo) {}
func (s *reasonSink) Enabled(int) bool      { return true }

func (s *reasonSink) Info(_ int, msg string, kv ...any) {
	if msg != "registration refused" {
		return
	}
	all := append(append([]any{}, s.values...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		if all[i] == "reason" {
			s.r.add(fmt.Sprint("refused: ", all[i+1]))
			return
		}
	}
}

func (s *reasonSink) Error(err error, msg string, _ ...any) {
	s.r.add(fmt.Sprintf("error: %s: %v", msg, err))
}

func (s *reasonSink) WithValues(kv ...any) logr.LogSink {
	return &reasonSink{r: s.r, values: append(append([]any{}, s.values...), kv...)}
}

func (s *reasonSink) WithName(string) logr.LogSink { return s }
