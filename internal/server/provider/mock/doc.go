// Package mock is a provider that only keeps records in memory. Instances are
// "running" as soon as they are created. It is used for scale tests and by the
// in-process fake shard; failures can be injected per call.
package mock
