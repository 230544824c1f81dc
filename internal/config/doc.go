// Package config parses and validates the shard server configuration
// (config/{shard}.jsonc, JSON with comments and trailing commas). Parsing
// rejects unknown keys and validation errors name the offending key path and
// the reason, e.g. `shard.bind.agent_addr: invalid address "x": ...`.
package config
