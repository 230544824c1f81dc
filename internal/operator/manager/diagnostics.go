package manager

import (
	"cmp"
	"net/http"
	"net/http/pprof"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The secure diagnostics server authenticates each request with a
// TokenReview and authorizes it with a SubjectAccessReview
// (filters.WithAuthenticationAndAuthorization).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// diagnostics returns the metrics server options: disabled for "0" or
// empty; plain HTTP with InsecureMetrics; otherwise HTTPS with
// authentication and authorization, which also serves pprof (as Cluster
// API's manager flags do: the endpoint is protected).
func diagnostics(o Options) metricsserver.Options {
	addr := cmp.Or(o.MetricsAddr, "0")
	if addr == "0" || o.InsecureMetrics {
		return metricsserver.Options{BindAddress: addr}
	}
	return metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		TLSOpts:        o.TLSOpts,
		ExtraHandlers: map[string]http.Handler{
			"/debug/pprof/":        http.HandlerFunc(pprof.Index),
			"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
			"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
			"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
		},
	}
}

// syncPeriod is nil (controller-runtime's default) for zero.
func syncPeriod(d time.Duration) *time.Duration {
	if d <= 0 {
		return nil
	}
	return &d
}
