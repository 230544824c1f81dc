// Package controlplane reconciles NstanceControlPlanes, the Cluster API
// control plane of a cluster whose API server Nstance does not run (the
// cluster the operator runs in, or the one NSTANCE_CAPI_ENDPOINT names). It
// keeps the <cluster>-kubeconfig Secret core Cluster API connects with (a
// ServiceAccount token from TokenRequest, re-requested before it expires;
// left to the user when NSTANCE_CAPI_ENDPOINT is set) and reports the
// control plane externally managed, initialized once that Secret exists,
// and Available, Ready and Paused, as the v1beta2 control plane contract
// asks.
package controlplane
