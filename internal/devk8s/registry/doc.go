// Package registry describes the resources dev-k8s serves: the built-in
// kinds it is given (the strategy package declares them, each with its
// rules) plus entries derived from CustomResourceDefinitions, and the
// discovery documents built from them.
package registry
