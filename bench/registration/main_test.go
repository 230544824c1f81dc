package main

import (
	"testing"
	"time"
)

// TestStormRegistersEveryAgent is the registration storm at a size make
// test can afford: 200 agents, each with its own TLS connection, source
// address, key and nonce, arrive over two seconds under the shard's default
// per-source limits; run fails if a single one is refused, and the server
// must log no error. The figures are the benchmark's (make bench,
// bench/RESULTS.md); this checks correctness.
func TestStormRegistersEveryAgent(t *testing.T) {
	why := newReasons()
	if err := run(200, 0, 0, "s3", 2*time.Second, why); err != nil {
		t.Fatal(err)
	}
	if errs := why.errors(); len(errs) > 0 {
		t.Fatalf("server errors: %q", errs)
	}
}

// TestThroughputRegistersEveryAgent is the closed-loop variant (16 clients
// over 4 shared connections) at 300 registrations.
func TestThroughputRegistersEveryAgent(t *testing.T) {
	why := newReasons()
	if err := run(300, 16, 4, "s3", 0, why); err != nil {
		t.Fatal(err)
	}
	if errs := why.errors(); len(errs) > 0 {
		t.Fatalf("server errors: %q", errs)
	}
}
