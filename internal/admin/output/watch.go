package output

import (
	"fmt"
	"strings"
)

// EventType says how an object changed.
type EventType string

// The event types of a watch.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
)

// Event is one change seen by a watch: Row is its table form (without the
// EVENT column), Object its machine form.
type Event struct {
	Type   EventType
	Row    []string
	Object Object
}

// wireEvent is an Event as JSON and YAML show it.
type wireEvent struct {
	Type   EventType `json:"type"`
	Object Object    `json:"object"`
}

// Stream prints the events of a watch as they come. In table form the first
// batch fixes the column widths (a longer value later only widens its own
// row), so rows line up without buffering the stream.
type Stream struct {
	p      *Printer
	header []string
	widths []int
}

// Stream starts a watch output with the given table header (EVENT is added in front).
func (p *Printer) Stream(header []string) *Stream {
	return &Stream{p: p, header: append([]string{"EVENT"}, header...)}
}

// Write prints a batch of events. The first batch (the initial list) prints
// the table header too, even when it is empty.
func (s *Stream) Write(evs ...Event) error {
	if s.p.Machine() {
		for _, ev := range evs {
			b, err := s.p.render(wireEvent{Type: ev.Type, Object: ev.Object}, false)
			if err != nil {
				return err
			}
			if s.p.Format == YAML {
				b = append([]byte("---\n"), b...)
			}
			if _, err := s.p.W.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	rows := make([][]string, 0, len(evs))
	for _, ev := range evs {
		rows = append(rows, append([]string{string(ev.Type)}, ev.Row...))
	}
	var b strings.Builder
	if s.widths == nil {
		s.widths = make([]int, len(s.header))
		s.widths[0] = len(Modified) // the longest event type
		for _, r := range append([][]string{s.header}, rows...) {
			for i, c := range r {
				if i < len(s.widths) && len(c) > s.widths[i] {
					s.widths[i] = len(c)
				}
			}
		}
		s.line(&b, s.header)
	}
	for _, r := range rows {
		s.line(&b, r)
	}
	_, err := fmt.Fprint(s.p.W, b.String())
	return err
}

func (s *Stream) line(b *strings.Builder, cells []string) {
	for i, c := range cells {
		if i == len(cells)-1 {
			b.WriteString(c)
			break
		}
		w := 0
		if i < len(s.widths) {
			w = s.widths[i]
		}
		fmt.Fprintf(b, "%-*s  ", w, c)
	}
	b.WriteString("\n")
}
