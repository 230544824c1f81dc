// Package watchfilter implements the operator's --watch-filter, Cluster API's
// convention for running several provider instances side by side: with a
// value set, an operator reconciles only the Nstance objects labelled
// cluster.x-k8s.io/watch-filter=<value>, and labels the objects it creates
// with the same value so that it goes on seeing them.
package watchfilter
