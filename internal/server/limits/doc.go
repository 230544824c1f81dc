// Package limits holds the small admission controls of the shard server's
// listeners: a concurrent-holder cap per key (watch streams per operator), a
// token bucket per key over a bounded key set (registration attempts per
// source address, instance creations per tenant), a listener wrapper that
// caps connections per source address, and the gRPC interceptors that apply
// them. Refusals answer ResourceExhausted with what limit was hit; nothing
// here grows without bound.
package limits
