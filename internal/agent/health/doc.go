// Package health samples the machine for the agent's health reports, straight
// from /proc and statfs: uptime, load averages (the kernel's 1/5/15-minute
// windows), CPU busy share between samples, memory, per-interface network
// counters and per-mount disk usage. The Sampler also keeps a ring of samples
// so CPU usage and network throughput can be averaged over 1, 5 and 15
// minutes. ReadTermination reads a pending termination notice from a file.
package health
