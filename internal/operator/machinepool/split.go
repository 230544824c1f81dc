package machinepool

// SplitReplicas divides total replicas over shards as evenly as possible.
// Every shard gets total/len(shards); the remainder goes one each to the
// first shards in the order given, which is the order of the pool's
// spec.shards list. So 5 over [a, b] is a=3, b=2, and 1 over [a, b] is a=1,
// b=0. A negative total counts as zero.
func SplitReplicas(total int32, shards []string) map[string]int32 {
	out := make(map[string]int32, len(shards))
	if len(shards) == 0 {
		return out
	}
	if total < 0 {
		total = 0
	}
	n := int32(len(shards))
	base, rem := total/n, total%n
	for i, s := range shards {
		size := base
		if int32(i) < rem {
			size++
		}
		out[s] = size
	}
	return out
}
