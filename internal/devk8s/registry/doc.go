// Package registry describes the resources dev-k8s serves: a fixed table of
// built-in kinds plus entries derived from CustomResourceDefinitions, and the
// discovery documents built from them.
package registry
