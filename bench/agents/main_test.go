package main

import (
	"os"
	"slices"
	"testing"
	"time"
)

// TestMain lets the test binary be the server child the load starts
// (startServer runs its own executable with -serve).
func TestMain(m *testing.M) {
	if slices.Contains(os.Args[1:], "-serve") {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestEveryReportReachesServerAndFloor is the agents benchmark at a size
// make test can afford: 50 agents with their own certificates, TLS
// connections and three streams each, reporting every 200 ms, against the
// real agentapi server and against the floor. runLoad fails when a stream
// fails or a report sent is not received. The memory and CPU figures are
// the benchmark's (make bench, bench/RESULTS.md); this checks correctness.
func TestEveryReportReachesServerAndFloor(t *testing.T) {
	for _, floor := range []bool{false, true} {
		res, err := runLoad(50, 2*time.Second, 200*time.Millisecond, 0, floor, 0)
		if err != nil {
			t.Fatalf("floor=%v: %v", floor, err)
		}
		if res.reportsPerS <= 0 || res.rssMiB <= 0 {
			t.Fatalf("floor=%v: no reports or no RSS measured: %+v", floor, res)
		}
	}
}
