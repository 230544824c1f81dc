package s3servers

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGate(t *testing.T) {
	for _, c := range []struct {
		name                               string
		compat, always, inMakeTest, cached bool
		run                                bool
		skip                               string
	}{
		{name: "make compat runs a store not built yet", compat: true, run: true},
		{name: "make compat runs a make-test store", compat: true, inMakeTest: true, run: true},
		{name: "an always store runs uncached", always: true, run: true},
		{name: "a make-test store runs when cached", inMakeTest: true, cached: true, run: true},
		{name: "a make-test store is skipped when not built", inMakeTest: true, skip: "is not built yet (/c/x); `make compat` builds it"},
		{name: "a compat-only store is skipped even when cached", cached: true, skip: "runs only in `make compat` (NSTANCE_COMPAT=1)"},
		{name: "a compat-only store is skipped uncached", skip: "runs only in `make compat`"},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, skip := Gate(c.compat, c.always, c.inMakeTest, c.cached, "x", "/c/x")
			require.Equal(t, c.run, run)
			if c.run {
				require.Empty(t, skip)
				return
			}
			require.Contains(t, skip, c.skip)
		})
	}
}
