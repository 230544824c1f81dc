// Package config reads the agent's settings from NSTANCE_* environment
// variables (see the Env* constants), applies defaults and reports every
// invalid variable by name.
package config
