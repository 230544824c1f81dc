// Package pprofserve serves net/http/pprof on a listener of its own
// (nstance-server --pprof-addr), off by default: profiles reveal internals,
// so the address belongs on loopback.
package pprofserve
