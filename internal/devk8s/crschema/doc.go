// Package crschema applies a CustomResourceDefinition's schemas to custom
// resources the way kube-apiserver does, by composing the
// apiextensions-apiserver libraries kube-apiserver itself uses: the
// structural schema, pruning of unknown fields (honouring
// x-kubernetes-preserve-unknown-fields), ObjectMeta coercion, defaulting,
// and the customresource registry strategies (OpenAPI schema validation,
// embedded ObjectMeta and list-type checks, x-kubernetes-validations CEL
// rules with transition rules and the runtime cost budget, metadata
// validation, generation and status-subresource handling). Every served
// version has its own schema; versions convert with the None strategy (only
// apiVersion changes).
package crschema
